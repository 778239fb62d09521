"""The memory benchmark's results as markdown: the headline table, the breakdown, the cross-checks."""

from __future__ import annotations

from typing import Any

TOLERANCE = 0.10
"""The plan should land within ±10% of measured model-state bytes."""
STATES = ("params", "grads", "optimizer", "master")


def mb(num_bytes: int | None) -> str:
    return "—" if num_bytes is None else f"{num_bytes / 1e6:,.0f} MB"


def per_param(num_bytes: int, params: int) -> str:
    """Bytes per model parameter: the unit the ZeRO paper's formulas use (16Ψ, 2Ψ + 14Ψ/N)."""
    return f"{num_bytes / params:.1f}"


def delta_per_param(num_bytes: int, params: int, workers: int) -> str:
    """A difference per rank in bytes per parameter, and in the formulas' Ψ/N units."""
    per = num_bytes / params
    return f"{per:+.1f} B/param per rank = {per * workers:+.1f}Ψ/N"


def headline(meta: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """backend | planned | measured | measured/planned | DeepSpeed's estimate | peak memory | step time."""
    gpu = meta["device"] == "gpu"
    peak = "peak GPU memory/rank" if gpu else "peak RSS/rank"
    lines = [
        f"| backend | planned model states/rank | measured/rank | measured/planned | "
        f"DeepSpeed estimator/rank | {peak} | step time vs ddp |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    base = (results.get("ddp") or {}).get("step_seconds")
    for result in results.values():
        name = result["backend"]
        if "measured" not in result:
            reason = result.get("failed", "no probe report")
            lines.append(f"| {name} | {mb(result['planned']['model_states'])} | failed: {reason} | | | | |")
            continue
        ratio = result["ratio"]
        flag = "" if abs(ratio - 1) <= TOLERANCE else " ✗"
        speed = result.get("step_seconds")
        relative = f"{speed / base:.2f}×" if speed and base else "—"
        lines.append(
            f"| {name} | {mb(result['planned']['model_states'])} | {mb(result['measured']['model_states'])} "
            f"| {ratio:.2f}{flag} | {mb(result.get('deepspeed_estimate'))} "
            f"| {mb(result.get('cuda_peak') if gpu else result['peak_rss'])} | {relative} |"
        )
    return lines


def breakdown(meta: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """Each model-state category measured (planned), and the buffers the plan does not count."""
    params = meta["model"]["params"]
    lines = [
        "| backend | params | grads | optimizer | master | B/param | comm buffers (not planned) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results.values():
        if "measured" not in result:
            continue
        held, plan = result["measured"], result["planned"]
        cells = [f"{mb(held[c])} ({mb(plan[c])})" for c in STATES]
        ratio = f"{per_param(held['model_states'], params)} ({per_param(plan['model_states'], params)})"
        lines.append(f"| {result['backend']} | {' | '.join(cells)} | {ratio} | {mb(held['buffers'])} |")
    return lines


def cross_checks(results: dict[str, Any]) -> list[str]:
    """RSS growth and the garbage collector's view of live tensors against the accounting."""
    lines = [
        "| backend | RSS growth, start → peak step | live tensors (gc sweep + DDP buckets) "
        "| not in the accounting | optimizer | param elements local/total | optimizer-state elements |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for result in results.values():
        if "measured" not in result:
            continue
        top = max(result["ranks"], key=lambda rank: rank["rss_at_peak"])
        report = (result["placement_reports"] or [{}])[0]
        elements = f"{report.get('param_elements_local', 0):,} / {report.get('param_elements_total', 0):,}"
        lines.append(
            f"| {result['backend']} | {mb(result['rss_growth'])} | {mb(result['live_tensor_bytes'])} "
            f"| {mb(top.get('uncounted_live_bytes'))} | {report.get('optimizer', '—')} | {elements} "
            f"| {report.get('optimizer_state_elements_local', 0):,} |"
        )
    return lines


def misses(meta: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """One line per backend outside the tolerance, naming the categories that differ."""
    params, workers = meta["model"]["params"], meta["workers"]
    lines = []
    for result in results.values():
        if "measured" not in result or abs(result["ratio"] - 1) <= TOLERANCE:
            continue
        held, plan = result["measured"], result["planned"]
        parts = [
            f"{c} {mb(held[c])} vs {mb(plan[c])} planned "
            f"({delta_per_param(held[c] - plan[c], params, workers)})"
            for c in STATES
            if abs(held[c] - plan[c]) > 0.02 * plan["model_states"]
        ]
        lines.append(
            f"- **{result['backend']}** measured {result['ratio']:.2f}× the plan: {'; '.join(parts)}."
        )
    return lines or [f"- every backend is within ±{TOLERANCE:.0%} of the plan."]


def markdown(meta: dict[str, Any], results: dict[str, Any]) -> str:
    """The whole results page."""
    model = meta["model"]
    versions = ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    header = [
        f"# Memory plan vs measured model states ({meta['device'].upper()}, {meta['date']})",
        "",
        f"Llama {model['hidden_size']}h × {model['num_hidden_layers']} layers, MLP "
        f"{model['intermediate_size']}: Ψ = {model['params']:,} parameters. Full-parameter SFT, "
        f"{meta['precision']}, {meta['workers']} ranks (N), {meta['steps']} steps, micro batch "
        f"{meta['micro_batch']}, max_length {meta['max_length']}, ZeRO buckets "
        f"{meta['zero2_bucket_size']:,} elements. {meta['cpu_count']} CPU cores; {versions}. "
        f"Whole run: {meta['runtime_seconds']} s. Written by `make bench` (bench/memory.py); "
        "bench/README.md says how to read it.",
        "",
        "Model states = parameters + gradients + optimizer states + master copies, per rank, at the "
        "moment they peak (right after the optimizer step), each storage counted once. "
        f"✗: outside ±{TOLERANCE:.0%}. Step time: median of steps 2+ on rank 0, relative to ddp.",
        "",
    ]
    body = [
        *headline(meta, results),
        "",
        "## By category: measured (planned), per rank",
        "",
        *breakdown(meta, results),
        "",
        "## Where the plan misses",
        "",
        *misses(meta, results),
        "",
        "## Cross-checks (largest rank)",
        "",
        *cross_checks(results),
        "",
    ]
    return "\n".join(header + body)
