"""The memory benchmark's results as markdown: the headline table, the breakdown, the cross-checks."""

from __future__ import annotations

from typing import Any

TOLERANCE = 0.10
"""The plan should land within ±10% of measured model-state bytes."""
STATES = ("params", "grads", "optimizer", "master")


def mb(num_bytes: int | None) -> str:
    return "—" if num_bytes is None else f"{num_bytes / 1e6:,.0f} MB"


KNOWN_CAUSES = {
    ("fsdp", "params"): "each rank's shard is a view into the whole tensor it was cut from at load, so the "
    "whole parameter stays alive (shard bytes vs storage bytes in the cross-checks); "
    "`fsdp.own_shard_storage` should have copied such shards out",
    ("ddp", "buffers"): "DDP all-reduces a flat bucket copy of every gradient and copies it back into "
    "p.grad (`gradient_as_bucket_view=False`, accelerate's default)",
    ("zero2+offload", "buffers"): "ZeRO-Offload keeps a partition-sized staging copy of the weights "
    "(`param_buffer_of_bit16_for_cpu_offload_groups`) and two gradient copy buffers",
}
"""Causes confirmed on the CPU run of 2026-12-02 (bench/README.md); printed only when the category misses.
ZeRO-2's fp32 master partition and fp32 gradient copy, its first misses, are in the plan now."""


def per_param(num_bytes: int, params: int) -> str:
    """Bytes per model parameter: the unit of the plan's formulas (16Ψ, 2Ψ + 18Ψ/N, 16Ψ/N)."""
    return f"{num_bytes / params:.1f}"


def cause(backend: str, category: str) -> str:
    known = KNOWN_CAUSES.get((backend, category))
    return f" Known cause: {known}." if known else ""


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
        "| not in the accounting | param bytes: shards seen / storages held | optimizer "
        "| param elements local/total (placement report) |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for result in results.values():
        if "measured" not in result:
            continue
        top = result["ranks"][result["largest_rank"]]
        report = (result["placement_reports"] or [{}])[0]
        elements = f"{report.get('param_elements_local', 0):,} / {report.get('param_elements_total', 0):,}"
        lines.append(
            f"| {result['backend']} | {mb(result['rss_growth'])} | {mb(result['live_tensor_bytes'])} "
            f"| {mb(top.get('uncounted_live_bytes'))} "
            f"| {mb(top.get('param_view_bytes'))} / {mb(result['measured']['params'])} "
            f"| {report.get('optimizer', '—')} | {elements} |"
        )
    return lines


def zero_holdings(results: dict[str, Any]) -> list[str]:
    """What DeepSpeed's ZeRO optimizer itself holds, by attribute: the evidence behind its rows."""
    lines = []
    for result in results.values():
        held = result.get("ranks", [{}])[0].get("zero_attributes") if result.get("ranks") else None
        if held:
            parts = ", ".join(f"`{name}` {mb(nbytes)}" for name, nbytes in held.items() if nbytes >= 1e6)
            lines.append(f"- **{result['backend']}** (rank 0, after the first step): {parts}.")
    return lines


def misses(meta: dict[str, Any], results: dict[str, Any]) -> list[str]:
    """Each backend outside the tolerance, the categories that differ, and buffers no column counts."""
    params = meta["model"]["params"]
    lines = []
    for result in results.values():
        if "measured" not in result:
            continue
        backend, held, plan = result["backend"], result["measured"], result["planned"]
        if abs(result["ratio"] - 1) > TOLERANCE:
            lines.append(f"- **{backend}** holds {result['ratio']:.2f}× the planned model states:")
            lines += [
                f"  - {c}: {mb(held[c])} measured, {mb(plan[c])} planned "
                f"({(held[c] - plan[c]) / params:+.1f} B/param).{cause(backend, c)}"
                for c in STATES
                if abs(held[c] - plan[c]) > 0.02 * plan["model_states"]
            ]
        if held["buffers"] > 0.05 * plan["model_states"]:
            lines.append(
                f"- **{backend}** also holds {mb(held['buffers'])} of buffers that grow with the model "
                f"({held['buffers'] / params:.1f} B/param), outside every plan column."
                + cause(backend, "buffers")
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
        "## Cross-checks (the rank with the most model states)",
        "",
        *cross_checks(results),
        "",
        "## What DeepSpeed's ZeRO optimizer holds",
        "",
        *(zero_holdings(results) or ["- no ZeRO stage ran."]),
        "",
    ]
    return "\n".join(header + body)
