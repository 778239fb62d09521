"""`kind: distill`: the teacher as a stage reference, planned like a reference copy, refused when its
vocabulary differs or when asked to run in an actor; the held-out measures checked against their
definitions; a tiny SFT teacher distilled into an untrained student through the CLI (its divergence to
the teacher falls, its agreement rises), and under fsdp on 2 ranks the teacher sharded as the plan says.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from align.cli import main
from align.config.spec import KINDS
from align.models.loading import resolve_model
from align.models.memory import format_bytes
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.placement import TEACHER_WITH_POLICY
from align.planning.plan import build
from tests.pipelines import QUIET_TRL, run, stage_folder, stage_record

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "pipelines" / "tiny_distill.yaml"
CPU = Hardware(accelerator=False, device_memory=80 * 2**30)
TOY = "align:toy/number-or-word"
GB = 10**9


def teacher_stage(steps: int = 30) -> dict:
    trl = {**QUIET_TRL, "max_steps": steps, "learning_rate": 1e-2, "per_device_train_batch_size": 32}
    return {"kind": "sft", "data": {"train": f"{TOY}/sft"}, "trl": {**trl, "assistant_only_loss": True}}


def distill_stage(steps: int = 15, teacher: object = "${stages.teacher.output}", **fields) -> dict:
    trl = {key: value for key, value in QUIET_TRL.items() if key != "max_length"}
    trl |= {"max_steps": steps, "learning_rate": 1e-2, "per_device_train_batch_size": 16}
    trl |= {"max_completion_length": 4, "beta": 0.0}  # forward KL: learns fastest from an untrained student
    data = {"train": f"{TOY}/train", "eval": f"{TOY}/test"}
    return {"kind": "distill", "model": "tiny", "teacher": teacher, "data": data, "trl": trl, **fields}


def write(folder: Path, stages: dict[str, dict], **defaults) -> Path:
    body = {
        "name": "distill",
        "base_model": "tiny",
        "defaults": {"output_root": str(folder / "runs"), **defaults},
    }
    path = folder / "distill.yaml"
    path.write_text(yaml.safe_dump({**body, "stages": stages}, sort_keys=False))
    return path


def validate(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str]:
    code = main(["validate", str(path)])
    return code, capsys.readouterr().err


def tiny_param_bytes() -> int:
    """The tiny model's parameter bytes in fp32, counted on the model itself (tied weights once)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    return 4 * sum(param.numel() for param in model.parameters())


# --- validate and plan: nothing loads ---


def test_the_shipped_pipeline_is_valid_and_its_teacher_is_an_upstream_stage() -> None:
    pipeline = load(SHIPPED)
    assert pipeline.edges["distill"] == ["teacher"]  # found through `teacher:` alone: its model is `tiny`
    assert pipeline.edges["eval"] == ["teacher", "distill"]
    assert KINDS["distill"].config == "trl.DistillationConfig"


def test_the_plan_counts_the_teacher_like_a_reference_copy(capsys) -> None:
    """Whole on each rank under ddp and zero2, half on each of 2 fsdp ranks, in the compute dtype."""
    whole = tiny_param_bytes()
    plans = {
        backend: build(load(SHIPPED, [f"stages.distill.backend={backend}", "defaults.workers=2"]), CPU)
        for backend in ("ddp", "zero2", "fsdp")
    }
    for backend, plan in plans.items():
        stage = plan.stages["distill"]
        assert stage.placement.teacher == TEACHER_WITH_POLICY
        teacher = dict((role, device) for role, device, _ in stage.memory.frozen_by_role)["teacher"]
        assert teacher == pytest.approx(whole / 2 if backend == "fsdp" else whole, abs=2), backend
        assert stage.memory.device.frozen == teacher  # the teacher is its only frozen model
    fsdp = plans["fsdp"].stages["distill"]
    assert "frozen, in the compute dtype, sharded like the policy" in fsdp.placement.description["teacher"]
    assert plans["ddp"].stages["teacher"].memory.device.frozen == 0  # the SFT stage holds none
    sets = ["--set", "stages.distill.backend=fsdp", "--set", "defaults.workers=2"]
    assert main(["plan", str(SHIPPED), *sets]) == 0
    out = capsys.readouterr().out
    distill = out[out.index("kind=distill") : out.index("kind=eval")]
    held = "stage teacher's output, frozen, in the compute dtype, sharded like the policy"
    assert f"teacher: {held}" in distill
    row = next(line.split() for line in distill.splitlines() if line.strip().startswith("teacher "))
    assert " ".join(row[-2:]) == format_bytes(-(-whole // 2))  # the fsdp column, the chosen one


def test_auto_shards_a_student_whose_teacher_does_not_fit_beside_it(tmp_path) -> None:
    """An 8B student of a 70B teacher on 8 x 80 GB: the teacher's 141 GB in bf16 fits no rank whole, so
    `auto` picks fsdp, where it is 1/8 per rank; the same student alone would take zero2."""
    stage = {
        "kind": "distill",
        "teacher": "meta-llama/Meta-Llama-3-70B-Instruct",
        "data": {"train": "hf:trl-lib/ultrafeedback-prompt@train"},
        "trl": {
            "per_device_train_batch_size": 1,
            "max_completion_length": 256,
            "activation_checkpointing": True,
        },
    }
    body = {
        "name": "big",
        "base_model": "meta-llama/Meta-Llama-3-8B-Instruct",
        "defaults": {"workers": 8, "precision": "bf16", "output_root": str(tmp_path)},
        "stages": {"distill": stage},
    }
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(body))
    gpus = Hardware(accelerator=True, device_memory=80 * GB, bf16=True)
    planned = build(load(path), gpus).stages["distill"]
    assert planned.backend == "fsdp", planned.backend_reason
    teacher = dict((role, device) for role, device, _ in planned.memory.frozen_by_role)["teacher"]
    assert teacher == pytest.approx(2 * 70.55e9 / 8, rel=0.01)
    replicated = dict((r, d) for r, d, _ in planned.memory_by_backend["zero2"].frozen_by_role)["teacher"]
    assert replicated == pytest.approx(2 * 70.55e9, rel=0.01)


def test_a_teacher_of_another_vocabulary_is_refused_naming_both_tokenizers(tmp_path, capsys) -> None:
    from transformers import AutoTokenizer

    other = tmp_path / "other-teacher"
    shutil.copytree(resolve_model("tiny"), other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<|tool|>", "<|think|>"])
    tokenizer.save_pretrained(other)
    path = write(tmp_path, {"distill": distill_stage(teacher=str(other))})
    code, err = validate(capsys, path)
    assert code == 2
    assert f"stages.distill.teacher: the teacher's tokenizer ({other}: 2,002 tokens" in err
    assert "differs from the student's (tiny: 2,000 tokens" in err
    assert "token '<|tool|>' (id 2000) is in one only" in err
    assert "share one vocabulary" in err


def test_a_teacher_of_the_same_tokenizer_from_another_folder_is_accepted(tmp_path, capsys) -> None:
    same = tmp_path / "same-teacher"
    shutil.copytree(resolve_model("tiny"), same)
    assert validate(capsys, write(tmp_path, {"distill": distill_stage(teacher=str(same))}))[0] == 0


def test_a_teacher_must_be_a_language_model_and_stay_beside_the_student(tmp_path, capsys) -> None:
    reward = {"kind": "reward", "data": {"train": "align:chatterbot/prefs/train"}, "trl": QUIET_TRL}
    stages = {
        "rm": reward,
        "distill": distill_stage(teacher={"model": "${stages.rm.output}", "placement": "actor"}),
    }
    code, err = validate(capsys, write(tmp_path, stages))
    assert code == 2
    assert "stages.distill.teacher.model: refers to stage 'rm', a reward stage" in err
    assert "stages.distill.teacher.placement: a teacher runs beside the student" in err
    assert "403 MB of fp32 logits" in err  # the measured figure (bench/distill_transfer.py)


# --- the held-out measures against their definitions ---


@pytest.fixture(scope="module")
def trainer_parts(tmp_path_factory):
    """A DistillationTrainer on the tiny model (never trained here), a perturbed copy as teacher, and 6
    held-out prompts."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import DistillationConfig, DistillationTrainer

    from align.data.corpora import build_toy
    from align.models.loading import load_tokenizer

    folder = resolve_model("tiny")
    tokenizer = load_tokenizer(folder)
    tokenizer.padding_side = "left"
    torch.manual_seed(0)
    student = AutoModelForCausalLM.from_pretrained(folder)
    teacher = AutoModelForCausalLM.from_pretrained(folder).requires_grad_(False)
    with torch.no_grad():
        for param in teacher.parameters():
            param.add_(0.05 * torch.randn_like(param))
    data = tmp_path_factory.mktemp("toy")
    build_toy(data)
    rows = [json.loads(line) for line in (data / "number-or-word-test.jsonl").open()][:6]
    prompts = Dataset.from_list([{"prompt": row["prompt"]} for row in rows])
    args = DistillationConfig(
        output_dir=str(tmp_path_factory.mktemp("out")),
        use_cpu=True,
        bf16=False,
        report_to=[],
        max_completion_length=5,
        beta=0.3,
        temperature=1.0,
    )
    trainer = DistillationTrainer(
        model=student, teacher_model=teacher, args=args, train_dataset=prompts, processing_class=tokenizer
    )
    return trainer, tokenizer, prompts


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-token generalized JSD written from its definition: beta KL(t || m) + (1 - beta) KL(s || m), with
    m = (1 - beta) s + beta t."""
    s, t = student_logits.log_softmax(-1).exp(), teacher_logits.log_softmax(-1).exp()
    m = (1 - beta) * s + beta * t
    return beta * (t * (t / m).log()).sum(-1) + (1 - beta) * (s * (s / m).log()).sum(-1)


def test_the_measures_match_their_definitions(trainer_parts) -> None:
    from align.stages.distill_measure import agreement, divergence, greedy_answers, teacher_measure

    trainer, tokenizer, prompts = trainer_parts
    answers = greedy_answers(trainer.teacher_model, tokenizer, list(prompts["prompt"]), 5)
    measured = teacher_measure(trainer, tokenizer, prompts, seed=0)("before")
    jsd, agreed = [], []
    with torch.no_grad():
        for answer in answers:
            ids = torch.cat([answer.prompt_ids, answer.completion_ids], dim=1)
            start, length = answer.prompt_ids.shape[1] - 1, answer.completion_ids.shape[1]
            own = trainer.model(input_ids=ids).logits[0, start : start + length]
            theirs = trainer.teacher_model(input_ids=ids).logits[0, start : start + length]
            assert torch.equal(theirs.argmax(-1), answer.completion_ids[0])  # the answers are greedy
            jsd.append(float(generalized_jsd(own, theirs, 0.3).mean()))
            agreed.append(float((own.argmax(-1) == answer.completion_ids[0]).float().mean()))
            assert divergence(trainer, answer) == pytest.approx(jsd[-1], rel=1e-4)
            assert agreement(trainer.model, answer) == agreed[-1]
    assert measured["teacher_jsd_before"] == pytest.approx(sum(jsd) / len(jsd), rel=1e-4)
    assert measured["teacher_agreement_before"] == pytest.approx(sum(agreed) / len(agreed))
    assert measured["teacher_jsd_ci_low_before"] <= measured["teacher_jsd_before"]
    assert measured["teacher_jsd_before"] <= measured["teacher_jsd_ci_high_before"]
    assert measured["teacher_prompts"] == 6
    assert measured["teacher_tokens"] == sum(answer.completion_ids.shape[1] for answer in answers)


def test_a_student_equal_to_its_teacher_agrees_on_every_token(trainer_parts) -> None:
    from align.stages.distill_measure import agreement, divergence, greedy_answers

    trainer, tokenizer, prompts = trainer_parts
    for answer in greedy_answers(trainer.teacher_model, tokenizer, list(prompts["prompt"]), 5):
        assert agreement(trainer.teacher_model, answer) == 1.0
    saved = trainer.model
    trainer.model = trainer.teacher_model
    try:
        assert divergence(trainer, answer) == pytest.approx(0.0, abs=1e-6)
    finally:
        trainer.model = saved


# --- through the CLI ---


@pytest.fixture(scope="module")
def distilled(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("distill")
    path = write(folder, {"teacher": teacher_stage(), "distill": distill_stage()})
    return path, run(path).stdout


@pytest.mark.integration
def test_the_student_moves_towards_its_teacher_on_held_out_prompts(distilled) -> None:
    path, stdout = distilled
    metrics = stage_record(path, "distill")["metrics"]
    assert metrics["teacher_jsd_after"] < 0.6 * metrics["teacher_jsd_before"]
    assert metrics["teacher_agreement_after"] >= metrics["teacher_agreement_before"] + 0.2
    assert metrics["teacher_agreement_ci_low_after"] > metrics["teacher_agreement_ci_high_before"]
    assert metrics["teacher_prompts"] == 64 and metrics["trainable_changed"] == 1.0
    summary = stdout[stdout.index("summary:") :]
    line = next(line for line in summary.splitlines() if line.strip().startswith("distill"))
    assert f"teacher_agreement_after={metrics['teacher_agreement_after']:.4g}" in line
    assert main(["report", str(path)]) == 0
    report = (stage_folder(path, "distill").parent / "report.md").read_text()
    after = metrics["teacher_agreement_after"]
    assert f"| teacher_agreement | {metrics['teacher_agreement_before']:.4g} | {after:.4g} |" in report


@pytest.mark.integration
def test_the_student_saves_as_a_plain_model_and_records_its_teacher(distilled) -> None:
    from transformers import AutoModelForCausalLM

    path, _ = distilled
    record = stage_record(path, "distill")
    assert record["output"]["kind"] == "model"
    student = AutoModelForCausalLM.from_pretrained(record["output"]["path"])
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    assert any(not torch.equal(a, b) for a, b in zip(student.parameters(), base.parameters(), strict=True))
    assert record["config"]["teacher"] == {"model": "${stages.teacher.output}"}  # placement: not recorded


# --- fsdp on 2 ranks: the teacher sharded as planned ---


@pytest.mark.integration
@pytest.mark.slow
def test_under_fsdp_the_teacher_is_sharded_as_the_plan_says(tmp_path) -> None:
    distill = distill_stage(steps=6, backend="fsdp", workers=2, precision="fp32")
    distill["data"]["max_eval_rows"] = 8  # each held-out forward is a collective: keep them few
    path = write(tmp_path, {"teacher": teacher_stage(), "distill": distill})
    run(path)
    planned = build(load(path), CPU).stages["distill"]
    teacher_bytes = dict((role, device) for role, device, _ in planned.memory.frozen_by_role)["teacher"]
    logs = stage_folder(path, "distill") / "logs"
    reports = [json.loads(p.read_text()) for p in sorted(logs.glob("fsdp-rank*.json"))]
    assert len(reports) == 2
    for report in reports:
        frozen = [model for model in report["models"] if not model["trainable"]]
        assert len(frozen) == 1 and frozen[0]["dtensor_params"] > 0  # the teacher, sharded
        assert frozen[0]["param_storage_bytes"] == pytest.approx(teacher_bytes, rel=0.02)
        student = next(model for model in report["models"] if model["trainable"])
        assert student["param_elements_local"] == pytest.approx(student["param_elements_total"] / 2, rel=0.02)
    metrics = stage_record(path, "distill")["metrics"]
    assert metrics["teacher_jsd_after"] < metrics["teacher_jsd_before"]
