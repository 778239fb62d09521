"""Sweeps: `sweep:` validated up front with errors that name the swept path; a grid expanded into ordinary
stages named by their values, the stages that read the swept one repeated and an eval stage asking every
variant; and, on Ray Tune, a grid that runs its shared stage once and its variants side by side, then skips
everything without Ray when run again; a random search whose ASHA stops a lagging variant; an interrupted
sweep that resumes without redoing a finished variant."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from align.cli import main
from align.pipeline.file import load
from tests.pipelines import run, stage, stage_record, write_pipeline

BETAS = [0.05, 0.1, 0.3]


def sweep_file(folder: Path, sweep: dict, stages: dict | None = None, name: str = "swept") -> Path:
    """SFT -> DPO -> eval on the tiny model, with `sweep:` added."""
    stages = stages or {
        "sft": stage("sft", steps=2),
        "dpo": stage("dpo", steps=6, model="${stages.sft.output}", lora={"r": 4}),
        "eval": {
            "kind": "eval",
            "models": {"sft": "${stages.sft.output}", "dpo": "${stages.dpo.output}"},
            "data": {"prompts": "align:toy/number-or-word/test", "max_rows": 16},
            "rewards": [{"function": "exact_answer"}],
            "generation": {"max_new_tokens": 4},
        },
    }
    path = write_pipeline(folder, name, stages)
    path.write_text(path.read_text() + yaml.safe_dump({"sweep": sweep}, sort_keys=False))
    return path


def problems(capsys, path: Path) -> str:
    assert main(["validate", str(path)]) == 2
    return capsys.readouterr().err


def test_each_bad_sweep_is_named_by_its_path_before_anything_loads(tmp_path, capsys) -> None:
    grid = {"parameters": {"stages.dpo.trl.betaa": [0.1]}, "metric": "eval/dpo/exact_answer"}
    err = problems(capsys, sweep_file(tmp_path, grid))
    assert (
        "sweep.parameters.stages.dpo.trl.betaa[0]: stages.dpo.trl.betaa: unknown DPOConfig field 'betaa'"
        in err
    )
    assert "did you mean 'beta'" in err

    typed = {"parameters": {"stages.dpo.trl.beta": [0.1, "high"]}, "metric": "eval/dpo/exact_answer"}
    err = problems(capsys, sweep_file(tmp_path, typed))
    assert (
        "sweep.parameters.stages.dpo.trl.beta[1]: stages.dpo.trl.beta: input should be a valid number" in err
    )
    assert "[0]" not in err  # 0.1 is a fine beta

    two = {
        "parameters": {"stages.dpo.trl.beta": [0.1], "stages.sft.trl.learning_rate": [0.1]},
        "metric": "x/y",
    }
    assert "the paths name stages dpo, sft; a sweep varies one stage" in problems(
        capsys, sweep_file(tmp_path, two)
    )

    unread = {"parameters": {"stages.dpo.trl.beta": [0.1]}, "metric": "eval/sft/exact_answer"}
    err = problems(capsys, sweep_file(tmp_path, unread))
    assert "sweep.metric: 'eval/sft/exact_answer': no eval stage compares a model 'sft'" in err
    assert "(models that read the swept stage: dpo)" in err

    drawn = {
        "parameters": {"stages.dpo.trl.learning_rate": {"loguniform": ["1e-4", 1.0e-3]}},
        "metric": "dpo/x",
    }
    err = problems(capsys, sweep_file(tmp_path, {**drawn, "method": "random"}))
    assert "loguniform takes two numbers [low, high]; YAML reads 1e-4 as text: write 1.0e-4" in err
    good = {"loguniform": [1.0e-4, 1.0e-3]}
    err = problems(
        capsys, sweep_file(tmp_path, {**drawn, "parameters": {"stages.dpo.trl.learning_rate": good}})
    )
    assert "method grid takes lists of values; 'stages.dpo.trl.learning_rate' is a distribution" in err


def test_a_grid_becomes_stages_named_by_their_values_and_the_eval_asks_each(tmp_path, capsys) -> None:
    grid = {"parameters": {"stages.dpo.trl.beta": BETAS}, "metric": "eval/dpo/exact_answer"}
    path = sweep_file(tmp_path, grid)
    pipeline = load(path)
    variants = [f"dpo[beta={beta:g}]" for beta in BETAS]
    assert list(pipeline.stages) == ["sft", *variants, "eval"]
    assert [pipeline.stages[name].trl["beta"] for name in variants] == BETAS
    assert all(pipeline.stages[name].model == "${stages.sft.output}" for name in variants)
    models = pipeline.stages["eval"].models
    assert models == {
        "sft": "${stages.sft.output}",
        **{f"dpo[beta={b:g}]": f"${{stages.dpo[beta={b:g}].output}}" for b in BETAS},
    }
    assert pipeline.edges["eval"] == ["sft", *variants]

    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "sweep: 3 variants of dpo (a grid over trl.beta), ranked by eval/dpo/exact_answer (max)" in out
    assert "each variant runs dpo; once for all: sft" in out
    assert all(f". {name}  kind=dpo" in out for name in variants)


def test_a_stage_that_reads_the_swept_one_is_repeated_per_variant(tmp_path) -> None:
    stages = {
        "dpo": stage("dpo", steps=2, lora={"r": 4}),
        "merge": {"kind": "merge", "model": "${stages.dpo.output}"},
    }
    grid = {"parameters": {"stages.dpo.trl.beta": [0.1, 0.2]}, "metric": "merge/merge_max_abs_logit_delta"}
    pipeline = load(sweep_file(tmp_path, {**grid, "mode": "min"}, stages))
    assert list(pipeline.stages) == ["dpo[beta=0.1]", "dpo[beta=0.2]", "merge[beta=0.1]", "merge[beta=0.2]"]
    assert pipeline.stages["merge[beta=0.2]"].model == "${stages.dpo[beta=0.2].output}"


def test_asha_hears_each_logged_step_once_however_far_apart_the_file_is_read() -> None:
    """The progress file is read seconds apart: every step logged since the last read reaches ASHA at its own
    step, in order, once; the last step waits for the variant's end."""
    from align.records import LoggedStep, Progress
    from align.run.tune_search import LoggedSteps

    steps = LoggedSteps()
    heard: list[tuple[int, float]] = []
    recent = [LoggedStep(step=step, values={"loss": 1.0 / step}) for step in range(1, 9)]
    read = Progress(max_steps=8, step=5, recent=recent[:5], started=0.0, time=1.0)
    for entry in [
        read,
        read,
        read.model_copy(update={"step": 7, "recent": recent[:7]}),
        read.model_copy(update={"step": 8, "recent": recent}),
    ]:
        heard += [(event.step, event.values["loss"]) for event in steps.new("dpo", entry)]  # read twice: once
    assert heard == [(step, 1.0 / step) for step in range(1, 8)]

    # a stage so fast that the file is first read at its end: its steps reach ASHA all the same
    at_its_end = read.model_copy(update={"step": 8, "recent": recent})
    assert [event.step for event in LoggedSteps().new("dpo", at_its_end)] == list(range(1, 8))


def test_asha_stops_the_variant_that_lags_at_a_rung() -> None:
    """Tune's ASHA, driven without a Tuner: the first variant sets the rungs; one worse at a rung stops there,
    one better goes on (a Ray whose ASHA reads more of a trial than its id fails here)."""
    from align.config.sweep import EarlyStop
    from align.run.tune_search import EarlyStopper, Logged

    stopper = EarlyStopper(EarlyStop(metric="loss", mode="min", grace_steps=2, reduction_factor=2), max_t=8)
    assert all(stopper.judge(Logged("dpo[lr=1]", step, {"loss": 1.0 / step})) is None for step in range(1, 8))
    assert stopper.judge(Logged("dpo[lr=3]", 2, {"loss": 0.1})) is None  # better than 0.5 at step 2
    stop = stopper.judge(Logged("dpo[lr=2]", 2, {"loss": 0.9}))
    assert stop is not None and stop.step == 2
    assert stop.reason == "stopped early by ASHA at step 2 (loss 0.9, min is better)"


@pytest.mark.integration
@pytest.mark.slow
def test_a_grid_runs_its_shared_stage_once_and_variants_side_by_side_then_skips_all(tmp_path) -> None:
    grid = {"parameters": {"stages.dpo.trl.beta": BETAS}, "metric": "eval/dpo/exact_answer"}
    path = sweep_file(tmp_path, grid)
    out = run(path).stdout
    assert out.count("[sft] running sft") == 1 and out.count("[sft] done in") == 1
    variants = [f"dpo[beta={beta:g}]" for beta in BETAS]
    sft = stage_record(path, "sft")
    spans = []
    for name in variants:
        record = stage_record(path, name)
        assert record["status"] == "succeeded" and record["config"]["trl"]["beta"] == float(name[9:-1])
        assert record["started"] >= sft["ended"]
        spans.append((record["started"], record["ended"]))
        assert f"[{name}] done in" in out
    overlaps = [min(a[1], b[1]) - max(a[0], b[0]) for i, a in enumerate(spans) for b in spans[i + 1 :]]
    assert max(overlaps) > 0  # at least two variants trained at the same time, with default resources
    metrics = stage_record(path, "eval")["metrics"]
    for name in variants:  # a row per variant, with its interval
        model = name
        assert {f"eval/{model}/exact_answer{end}" for end in ("", "/low", "/high", "/win")} <= set(metrics)
    state = json.loads((tmp_path / "runs" / "swept" / "sweep.json").read_text())
    assert [variant["status"] for variant in state["variants"]] == ["succeeded"] * 3

    again = run(path).stdout
    assert "ray:" not in again  # nothing to run: Ray never started
    assert all(f"[{name}] skipped: up to date" in again for name in ["sft", *variants, "eval"])
    assert " ran " not in again


@pytest.mark.integration
@pytest.mark.slow
def test_asha_stops_a_lagging_variant_of_a_random_search(tmp_path) -> None:
    """Four learning rates drawn one at a time; the ones that barely move the loss lag at a rung and stop."""
    # with its held-out samples, a variant outlives its last logged step long enough for ASHA to judge it
    stages = {"dpo": stage("dpo", steps=8, lora={"r": 4}, trl={"logging_steps": 1}, samples=4)}
    search = {
        "parameters": {"stages.dpo.trl.learning_rate": {"loguniform": [1.0e-7, 1.0e-2]}},
        "method": "random",
        "samples": 4,
        "max_concurrent": 1,
        "metric": "dpo/train_loss_last",
        "mode": "min",
        "early_stop": {"metric": "loss", "mode": "min", "grace_steps": 2, "reduction_factor": 2},
    }
    path = sweep_file(tmp_path, search, stages)
    out = run(path).stdout
    state = json.loads((tmp_path / "runs" / "swept" / "sweep.json").read_text())["variants"]
    rate = {variant["status"]: [] for variant in state}
    for variant in state:
        rate[variant["status"]].append(variant["values"]["stages.dpo.trl.learning_rate"])
    assert len(state) == 4 and rate.get("stopped") and rate.get("succeeded"), out[-3000:]
    assert max(rate["stopped"]) < max(rate["succeeded"])  # the best learning rate ran to the end
    assert all(variant["step"] < 8 for variant in state if variant["status"] == "stopped")
    assert "stopped early by ASHA at step" in out
    for lr in rate["stopped"]:  # its stage never finished: no record in its folder
        assert not (tmp_path / "runs" / "swept" / f"dpo[learning_rate={lr:g}]" / "align-stage.json").exists()


@pytest.mark.integration
@pytest.mark.faults
def test_an_interrupted_sweep_resumes_without_redoing_finished_variants(tmp_path) -> None:
    stages = {"dpo": stage("dpo", steps=24, lora={"r": 4}, trl={"save_strategy": "steps", "save_steps": 4})}
    grid = {"parameters": {"stages.dpo.trl.beta": [0.1, 0.2]}, "metric": "dpo/train_loss_last", "mode": "min"}
    path = sweep_file(tmp_path, {**grid, "max_concurrent": 1}, stages)
    folder = tmp_path / "runs" / "swept"
    command = [sys.executable, "-m", "align.cli", "run", str(path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as first:
        deadline = time.time() + 600
        while time.time() < deadline and not list(
            folder.glob(".dpo[[]beta=0.2].tmp-*/checkpoints/checkpoint-*")
        ):
            assert first.poll() is None, first.communicate()
            time.sleep(0.5)
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM, out[-2000:] + err[-2000:]
    assert "`align run" in err and "resumes it" in err
    finished = stage_record(path, "dpo[beta=0.1]")

    again = run(path).stdout
    assert stage_record(path, "dpo[beta=0.1]")["started"] == finished["started"]  # not redone
    resumed = stage_record(path, "dpo[beta=0.2]")
    assert resumed["status"] == "succeeded" and resumed["resumed_from"] >= 4, again[-2000:]
    assert os.path.exists(folder / "sweep.json")
