"""`align sweep-report` on finished sweeps written by hand (no training): variants ranked best first by
`mode`, the eval's interval and win rate against its baseline (or a stage's metric, with no interval), how a
variant ended, whether the best separates from the runner-up, the plot, the `best/<stage>` links, and the
errors for a pipeline without a sweep or a sweep not run yet."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from align.cli import main
from align.pipeline.file import load
from tests.fake_records import write_record
from tests.pipelines import stage, write_pipeline

BETAS = [0.05, 0.1, 0.3, 1.0]
PNG = b"\x89PNG\r\n\x1a\n"


def sweep_file(folder: Path, metric: str = "eval/merged/exact_answer", mode: str = "max") -> Path:
    """SFT -> DPO -> merge -> eval (sft the baseline), with DPO's beta swept over BETAS."""
    stages = {
        "sft": stage("sft", steps=2),
        "dpo": stage("dpo", steps=6, model="${stages.sft.output}", lora={"r": 4}),
        "merge": {"kind": "merge", "model": "${stages.dpo.output}"},
        "eval": {
            "kind": "eval",
            "models": {"sft": "${stages.sft.output}", "merged": "${stages.merge.output}"},
            "baseline": "sft",
            "data": {"prompts": "align:toy/number-or-word/test"},
            "rewards": [{"function": "exact_answer"}],
        },
    }
    path = write_pipeline(folder, "swept", stages)
    sweep = {"parameters": {"stages.dpo.trl.beta": BETAS}, "metric": metric, "mode": mode}
    path.write_text(path.read_text() + yaml.safe_dump({"sweep": sweep}, sort_keys=False))
    return path


def figures(model: str, mean: float, low: float, high: float, win: tuple[float, float, float] | None) -> dict:
    """An eval record's metrics for one model on `exact_answer`, as align/stages/eval.py names them."""
    key = f"eval/{model}/exact_answer"
    found = {key: mean, f"{key}/low": low, f"{key}/high": high, f"{key}/n": 64.0}
    if win:
        found |= {f"{key}/win": win[0], f"{key}/win_low": win[1], f"{key}/win_high": win[2]}
    return found


def done(folder: Path, metrics: dict[str, float]) -> None:
    write_record(folder, status="succeeded", metrics=metrics)


def finish(path: Path, ends: list[dict[str, Any]], evals: dict[str, float]) -> Path:
    """A run of the sweep at `path` as its run leaves it: `sweep.json` with each variant's end, a record per
    finished variant's stages (dpo's `eval_loss_after` is its beta times 10) and the eval stage's metrics."""
    pipeline = load(path)
    folder = Path(pipeline.defaults.output_root) / pipeline.name
    for end in ends:
        if end["status"] == "succeeded":
            beta = end["values"]["stages.dpo.trl.beta"]
            done(folder / f"dpo[beta={beta:g}]", {"eval_loss_after": beta * 10})
            done(folder / f"merge[beta={beta:g}]", {})
    done(folder / "sft", {})
    done(folder / "eval", {**figures("sft", 0.5, 0.4, 0.6, None), **evals})
    spec = pipeline.sweep.spec.model_dump(mode="json")
    (folder / "sweep.json").write_text(json.dumps({"spec": spec, "variants": ends}))
    return folder


def ended(beta: float, status: str = "succeeded", **more: Any) -> dict[str, Any]:
    return {"values": {"stages.dpo.trl.beta": beta}, "status": status, **more}


STOPPED = ended(0.3, "stopped", step=4, reason="stopped early by ASHA at step 4 (loss 0.69, min is better)")
FAILED = ended(1.0, "failed", error="RuntimeError: out of memory")


def report(capsys, path: Path) -> tuple[int, str, str]:
    code = main(["sweep-report", str(path)])
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> list[str]:
    """The console table's rows (after its header), each with its spacing collapsed."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("beta")) + 1
    return [" ".join(line.split()) for line in lines[start:] if line.startswith("    ")]


def test_variants_ranked_by_mode_with_intervals_win_rates_ends_and_a_separated_best(tmp_path, capsys) -> None:
    path = sweep_file(tmp_path)
    evals = {
        **figures("merged[beta=0.05]", 0.4, 0.3, 0.5, (0.45, 0.35, 0.55)),
        **figures("merged[beta=0.1]", 0.8, 0.7, 0.9, (0.7, 0.6, 0.8)),
    }
    folder = finish(path, [ended(0.05), ended(0.1), STOPPED, FAILED], evals)

    code, out, _ = report(capsys, path)
    assert code == 0
    assert "win rate vs sft [95% CI], ties half" in out
    assert table_rows(out) == [
        "0.1 0.800 [0.700, 0.900] 0.700 [0.600, 0.800] done",
        "0.05 0.400 [0.300, 0.500] 0.450 [0.350, 0.550] done",
        "0.3 - - stopped early by ASHA at step 4 (loss 0.69, min is better)",
        "1 - - failed: RuntimeError: out of memory",
    ]
    assert "best: beta=0.1 (eval/merged/exact_answer 0.800 [0.700, 0.900], max is better)" in out
    assert "runner-up: beta=0.05 (0.400 [0.300, 0.500])" in out
    assert "their 95% intervals do not overlap" in out
    page = (folder / "sweep-report.md").read_text()
    assert "| 0.1 | 0.800 [0.700, 0.900] | 0.700 [0.600, 0.800] | done |" in page
    assert "![eval/merged/exact_answer" in page and "(sweep-report.png)" in page
    assert (folder / "sweep-report.png").read_bytes().startswith(PNG)

    mode_min = sweep_file(tmp_path, mode="min")
    finish(mode_min, [ended(0.05), ended(0.1), STOPPED, FAILED], evals)
    _, out, _ = report(capsys, mode_min)
    assert [row.split()[0] for row in table_rows(out)] == ["0.05", "0.1", "0.3", "1"]
    assert "best: beta=0.05" in out


def test_overlapping_intervals_say_the_data_cannot_tell_the_best_from_the_runner_up(tmp_path, capsys) -> None:
    path = sweep_file(tmp_path)
    evals = {
        **figures("merged[beta=0.05]", 0.55, 0.4, 0.7, (0.5, 0.4, 0.6)),
        **figures("merged[beta=0.1]", 0.6, 0.45, 0.75, (0.55, 0.45, 0.65)),
        **figures("merged[beta=0.3]", 0.6, 0.45, 0.75, (0.55, 0.45, 0.65)),
    }
    finish(path, [ended(0.05), ended(0.1), ended(0.3), ended(1.0, "interrupted")], evals)
    _, out, _ = report(capsys, path)
    assert "best: beta=0.1" in out and "runner-up: beta=0.3" in out
    assert "2 variants tie at 0.6: the best is the first in the sweep's order" in out
    assert "their 95% intervals overlap: the data cannot tell them apart" in out
    assert "do not overlap" not in out
    assert table_rows(out)[-1] == "1 - - interrupted: the next `align run` resumes it"


def test_a_stage_metric_has_no_interval_and_a_grid_variant_not_run_says_so(tmp_path, capsys) -> None:
    path = sweep_file(tmp_path, metric="dpo/eval_loss_after", mode="min")
    finish(path, [ended(0.1), ended(0.3), FAILED], {})
    code, out, _ = report(capsys, path)
    assert code == 0
    assert "dpo/eval_loss_after (no interval)" in out and "win rate" not in out
    assert table_rows(out) == [
        "0.1 1 done",
        "0.3 3 done",
        "1 - failed: RuntimeError: out of memory",
        "0.05 - not run yet",
    ]
    assert (
        "dpo/eval_loss_after has no interval (one value per variant): the data cannot say if they differ"
        in out
    )


def test_the_best_variants_stages_are_linked_and_replaced_on_a_rerun(tmp_path, capsys) -> None:
    path = sweep_file(tmp_path)
    better = figures("merged[beta=0.1]", 0.8, 0.7, 0.9, (0.7, 0.6, 0.8))
    worse = figures("merged[beta=0.3]", 0.4, 0.3, 0.5, (0.45, 0.35, 0.55))
    folder = finish(path, [ended(0.1), ended(0.3)], {**better, **worse})
    assert report(capsys, path)[0] == 0
    best = folder / "best"
    assert sorted(p.name for p in best.iterdir()) == ["dpo", "merge"]
    assert os.readlink(best / "dpo") == "../dpo[beta=0.1]"
    assert os.readlink(best / "merge") == "../merge[beta=0.1]"
    assert (best / "dpo").resolve() == (folder / "dpo[beta=0.1]").resolve()

    flipped = {
        **figures("merged[beta=0.1]", 0.3, 0.2, 0.4, None),
        **figures("merged[beta=0.3]", 0.9, 0.8, 1.0, None),
    }
    finish(path, [ended(0.1), ended(0.3)], flipped)
    (best / "ppo").symlink_to("../gone")  # a link of a stage the sweep no longer repeats
    _, out, _ = report(capsys, path)
    assert f"{best / 'merge'} -> ../merge[beta=0.3]" in out
    assert sorted(p.name for p in best.iterdir()) == ["dpo", "merge"]
    assert os.readlink(best / "dpo") == "../dpo[beta=0.3]"


def test_a_pipeline_without_a_sweep_or_a_sweep_not_run_is_a_clear_error(tmp_path, capsys) -> None:
    plain = write_pipeline(tmp_path, "plain", {"sft": stage("sft", steps=2)})
    code, _, err = report(capsys, plain)
    assert code == 2
    assert f"{plain} has no `sweep:`: align sweep-report reads a pipeline with `sweep:`" in err
    assert f"`align report {plain}` shows a plain run" in err

    swept = sweep_file(tmp_path)
    code = main(["sweep-report", str(swept), "--set", "stages.sft.trl.max_steps=3"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"the sweep of {swept} has not run yet: no {tmp_path / 'runs' / 'swept' / 'sweep.json'}" in err
    assert f"`align run {swept} --set stages.sft.trl.max_steps=3` runs it" in err


def test_align_run_of_a_sweep_ends_with_its_table(tmp_path, capsys, monkeypatch) -> None:
    import align.run.sweep

    path = sweep_file(tmp_path)
    only_one = figures("merged[beta=0.1]", 0.8, 0.7, 0.9, (0.7, 0.6, 0.8))  # 0.05 not compared (yet)
    finish(path, [ended(0.05), ended(0.1), FAILED], only_one)
    monkeypatch.setattr(align.run.sweep, "run_sweep", lambda plan, **settings: [])  # the run, done
    assert main(["run", str(path)]) == 0
    out = capsys.readouterr().out
    assert table_rows(out)[:4] == [
        "0.1 0.800 [0.700, 0.900] 0.700 [0.600, 0.800] done",
        "0.05 - - done, but its records hold no eval/merged/exact_answer",
        "1 - - failed: RuntimeError: out of memory",
        "0.3 - - not run yet",
    ]
    assert "no runner-up: no other variant has a value to compare with" in out
    assert "best: beta=0.1" in out and f"`align sweep-report {path}` writes its plot" in out
