"""The demo pipeline end to end through the real CLI, Ray, TRL and PEFT: SFT -> DPO (LoRA) -> merge on the
number-or-word task, then the demo's own ending (an eval stage comparing base, SFT and merged) and its report.

One run is shared by the tests below (about 70 s on 2 cores); reruns check skipping and invalidation.
"""

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pages import find_chromium, ink, inline_images, view
from safetensors.torch import load_file

from tests.pipelines import logged_losses

pytestmark = pytest.mark.integration

DEMO = "pipelines/demo_number_or_word.yaml"
RECORD = "align-stage.json"


def align_run(output_root: Path, *extra: str) -> str:
    """`align run` of the demo into `output_root`; returns its output, failing the test on a non-zero exit."""
    command = [sys.executable, "-m", "align.cli", "run", DEMO, "--set", f"defaults.output_root={output_root}"]
    done = subprocess.run([*command, *extra], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


EVENT = re.compile(r"^\[([A-Za-z_][\w-]*)\] (running|skipped)\b")


def status_lines(output: str) -> dict[str, str]:
    """Stage -> 'skipped' or 'running', from the controller's event lines."""
    return dict(match.groups() for match in map(EVENT.match, output.splitlines()) if match)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    output = align_run(root)
    return root / "number-or-word", output


def record(folder: Path, stage: str) -> dict:
    return json.loads((folder / stage / RECORD).read_text())


def test_sft_loss_falls(demo_run):
    metrics = record(demo_run[0], "sft")["metrics"]
    assert metrics["train_loss_last"] < 0.8 * metrics["train_loss_first"]
    assert metrics["eval_loss_after"] < metrics["eval_loss_before"] - 1.0


def test_dpo_beats_the_sft_model_it_started_from(demo_run):
    metrics = record(demo_run[0], "dpo")["metrics"]
    assert metrics["dpo_reward_accuracy_before"] == 0.5  # policy = reference: every pair ties, counted half
    assert metrics["dpo_reward_ties_before"] == 1.0
    assert metrics["dpo_reward_accuracy_after"] >= 0.9  # chosen above rejected, policy vs reference
    assert metrics["preference_margin_after"] > metrics["preference_margin_before"]


def test_the_demo_ends_with_an_eval_where_dpo_got_the_period_right_and_sft_did_not(demo_run):
    """The demo's last word, as `make demo` prints it: the held-out items asked of each model, scored with
    intervals, and the merged model's win rate against SFT."""
    folder, output = demo_run
    metrics = record(folder, "eval")["metrics"]
    assert metrics["eval/base/exact_answer"] == 0.0
    assert metrics["eval/sft/exact_answer"] >= 58 / 64 and metrics["eval/sft/format"] < 0.5
    assert metrics["eval/merged/format"] >= 58 / 64  # the period DPO preferred, on items it never saw
    assert metrics["eval/merged/format/win_low"] > 0.5  # better than SFT, interval and all
    for name in ("base", "sft", "merged"):
        assert metrics[f"eval/{name}/exact_answer/n"] == 64.0
    table = output[output.index("summary:") :]
    assert re.search(r"merged\s+format\s+1\.000 \[1\.000, 1\.000\]\s+64\s+1\.000 \[", table), table
    answers = [json.loads(line) for line in (folder / "eval/eval/answers.jsonl").read_text().splitlines()]
    assert len(answers) == 64 and answers[0]["answers"]["merged"][0] in ("number.", "word.")


def test_stage_folders_hold_exactly_the_expected_files(demo_run):
    folder = demo_run[0]
    listing = {stage: sorted(p.name for p in (folder / stage).iterdir()) for stage in ("sft", "dpo", "merge")}
    assert listing == {
        "sft": [RECORD, "logs", "model"],
        "dpo": ["adapter", RECORD, "logs"],
        "merge": [RECORD, "logs", "model"],  # logs: its worker log
    }
    tokenizer_files = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert {"config.json", "model.safetensors", *tokenizer_files} <= {
        p.name for p in (folder / "merge/model").iterdir()
    }
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {
        p.name for p in (folder / "dpo/adapter").iterdir()
    }
    for trained in ("sft", "dpo"):
        assert sorted(p.name for p in (folder / trained / "logs").iterdir()) == [
            "metrics.jsonl",
            "placement-rank0.json",
            "progress.json",
            "tensorboard",  # TensorBoard by default: the demo's `trl:` blocks leave `report_to` unset
            "worker-0.log",
        ]
        assert_tensorboard_holds_the_logged_losses(folder / trained / "logs")
    assert sorted(p.name for p in (folder / "merge" / "logs").iterdir()) == ["worker-0.log"]
    hidden = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert hidden == [".align-run.lock"]  # the run lock, empty once released


def assert_tensorboard_holds_the_logged_losses(logs: Path) -> None:
    """The TensorBoard events (one file per writer TRL opened) hold the training loss of every logged step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = list((logs / "tensorboard").iterdir())
    assert events and all(path.name.startswith("events.out.tfevents.") for path in events)
    accumulator = EventAccumulator(str(logs / "tensorboard"))
    accumulator.Reload()
    logged = [json.loads(line) for line in (logs / "metrics.jsonl").read_text().splitlines()]
    losses = {entry["step"]: entry["loss"] for entry in logged if "loss" in entry}
    shown = {event.step: event.value for event in accumulator.Scalars("train/loss")}
    assert shown == pytest.approx(losses)


def test_a_rank_alone_trains_as_a_plain_trl_script_does(demo_run):
    """The demo's stages have one rank each: no process group, so Accelerate sees no distributed run and
    leaves the model unwrapped (in a group of one it wrapped it in DDP: 1.2x the step), with torch's threads
    on the cores the plan gave the rank and the process at the niceness of a plain script, not Ray's 15."""
    for stage in ("sft", "dpo"):
        facts = json.loads((demo_run[0] / stage / "logs" / "placement-rank0.json").read_text())
        cpus = record(demo_run[0], stage)["ranks"][0]["cpus"]
        assert (facts["distributed"], facts["world_size"]) == ("NO", 1)
        assert facts["torch_threads"] == max(1, round(cpus))
        assert facts["niceness"] == 0


def test_a_trained_stage_s_time_is_accounted_for_part_by_part(demo_run):
    """What align does around TRL's loop is priced in the record and said under the stage's summary line."""
    folder, output = demo_run
    for stage in ("sft", "dpo"):
        data = record(folder, stage)
        parts = [data["metrics"][f"time_{part}_s"] for part in ("prepare", "train", "measure_before", "save")]
        assert all(seconds >= 0 for seconds in parts)
        assert sum(parts) <= data["ended"] - data["started"]
        assert 0 < data["metrics"]["seconds_per_step_steady"] < data["metrics"]["time_train_s"]
    summary = output[output.index("summary:") :]
    assert summary.count("    time: train ") == 2, summary


def test_records_say_what_produced_each_stage(demo_run):
    for stage in ("sft", "dpo", "merge"):
        data = record(demo_run[0], stage)
        assert data["status"] == "succeeded"
        assert data["ended"] >= data["started"]
        assert data["versions"]["trl"] and data["versions"]["torch"]
        assert len(data["fingerprint"]) == 64
    assert record(demo_run[0], "dpo")["output"]["base"] == str(demo_run[0] / "sft" / "model")


def test_records_hold_greedy_samples_of_held_out_prompts_before_and_after(demo_run):
    folder = demo_run[0]
    for stage, count in (("sft", 4), ("dpo", 4), ("merge", 3)):  # merge: its three check prompts
        samples = record(folder, stage)["samples"]
        assert len(samples) == count
        assert all(set(sample) == {"prompt", "before", "after"} for sample in samples)
        assert all(sample["prompt"].startswith("user: ") for sample in samples)
    sft = record(folder, "sft")["samples"]
    assert [s["before"] for s in sft] != [s["after"] for s in sft]  # SFT changed what the model says
    merge = record(folder, "merge")["samples"]
    assert [s["before"] for s in merge] == [s["after"] for s in merge]  # merging changed nothing


DEMO_PANELS = {
    "sft": "loss; learning rate; gradient norm; token accuracy; entropy",
    "dpo": "loss; learning rate; gradient norm; token accuracy; reward accuracy; reward margin; "
    "implicit rewards; log-probs; entropy",
}


@pytest.fixture(scope="module")
def demo_report(demo_run) -> tuple[Path, Path]:
    """`align report` of the demo's run folder, written beside the run as by default."""
    folder = demo_run[0]
    done = subprocess.run(
        [sys.executable, "-m", "align.cli", "report", str(folder)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [str(folder / "report.html"), str(folder / "report.md")]
    return folder / "report.html", folder / "report.md"


def test_the_demo_report_has_every_plot_as_a_real_png_and_lists_every_stage(demo_report):
    page, summary = demo_report
    text = page.read_text()
    images = inline_images(text)
    assert set(images) == {"stages and which feeds which", "sft", "dpo", "eval"}  # merge logs no curve
    assert {stage: images[stage][1] for stage in DEMO_PANELS} == DEMO_PANELS
    for png, _ in images.values():
        assert ink(png) > 0.02
    for sample in record(page.parent, "dpo")["samples"]:
        assert html.escape(sample["after"].replace("\n", "⏎")) in text
    markdown = summary.read_text()
    assert [line for line in markdown.splitlines() if line.startswith("## ")] == [
        "## sft",
        "## dpo",
        "## merge",
        "## eval",
    ]
    assert "| merged | format | 1.000 [1.000, 1.000] | 64 | 1.000 [" in markdown
    assert "- dpo <- sft" in markdown and "- merge <- dpo" in markdown
    assert "| preference_accuracy |" in markdown and "| eval_loss |" in markdown
    assert "| parameters |" in markdown  # the memory plan, beside each rank's measured peak
    assert "| 0 | " in markdown


def test_the_demo_report_shows_its_plots_in_headless_chromium(demo_report):
    binary = find_chromium()
    if binary is None:
        pytest.skip("Chromium is not installed (`make chromium` installs Debian's package)")
    seen = view(demo_report[0], binary)
    assert seen.errors == []
    assert [image["alt"].split(":")[0] for image in seen.images] == [
        "stages and which feeds which",
        "sft",
        "dpo",
        "eval",
    ]
    assert all(image["complete"] and image["width"] > 300 and image["height"] > 100 for image in seen.images)


def test_merged_model_loads_in_plain_transformers_and_matches_the_adapter(demo_run):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = demo_run[0]
    assert record(folder, "merge")["metrics"]["merge_max_abs_logit_delta"] <= 1e-4
    merged = AutoModelForCausalLM.from_pretrained(folder / "merge/model").eval()
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(folder / "sft/model"), folder / "dpo/adapter"
    )
    tokenizer = AutoTokenizer.from_pretrained(folder / "merge/model")
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Number or word? 7"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        delta = (merged(input_ids=ids).logits - adapted.eval()(input_ids=ids).logits).abs().max().item()
    assert delta <= 1e-4
    generated = merged.generate(input_ids=ids, max_new_tokens=8, do_sample=False)
    assert generated.shape[1] > ids.shape[1]


def test_a_stage_on_a_warm_worker_trains_as_it_does_on_fresh_ones(demo_run):
    """The demo's dpo ran on the worker that had just run sft; run alone, it starts on fresh workers. A
    stage must not inherit anything from the one before it in the same process."""
    folder, _ = demo_run
    adapter = folder / "dpo" / "adapter" / "adapter_model.safetensors"
    warm_weights, warm_losses = load_file(adapter), logged_losses(folder / "dpo")
    fresh = align_run(folder.parent, "--stage", "dpo", "--force", "dpo")
    assert status_lines(fresh) == {"sft": "skipped", "dpo": "running"}
    assert logged_losses(folder / "dpo") == warm_losses
    fresh_weights = load_file(adapter)
    assert fresh_weights.keys() == warm_weights.keys()
    assert all(torch.equal(fresh_weights[name], warm_weights[name]) for name in warm_weights)


def test_a_rerun_with_every_stage_up_to_date_starts_no_ray_and_imports_no_torch(demo_run):
    folder, _ = demo_run
    code = (
        "import sys; from align.cli import main\n"
        f"assert main(['run', {DEMO!r}, '--set', 'defaults.output_root={folder.parent}']) == 0\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'trl', 'ray') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "skipped: up to date" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_rerun_skips_every_stage_and_a_changed_trl_value_reruns_it_and_downstream(demo_run):
    folder, _ = demo_run
    stamps = {
        stage: (folder / stage / RECORD).stat().st_mtime_ns for stage in ("sft", "dpo", "merge", "eval")
    }
    again = align_run(folder.parent)
    assert status_lines(again) == {"sft": "skipped", "dpo": "skipped", "merge": "skipped", "eval": "skipped"}
    assert stamps == {stage: (folder / stage / RECORD).stat().st_mtime_ns for stage in stamps}

    changed = align_run(folder.parent, "--set", "stages.dpo.trl.beta=0.2")
    assert status_lines(changed) == {
        "sft": "skipped",
        "dpo": "running",
        "merge": "running",
        "eval": "running",
    }
    assert (folder / "sft" / RECORD).stat().st_mtime_ns == stamps["sft"]
    assert record(folder, "dpo")["config"]["trl"]["beta"] == 0.2


def test_force_reruns_the_named_stage_and_what_follows_only(demo_run):
    folder, _ = demo_run
    forced = align_run(folder.parent, "--set", "stages.dpo.trl.beta=0.2", "--force", "merge")
    assert status_lines(forced) == {"sft": "skipped", "dpo": "skipped", "merge": "running", "eval": "running"}
