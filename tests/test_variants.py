"""The variants people ask for by name, each trained through the CLI with its own measure moving the right
way, all in one pipeline run from one toy SFT model (about 4 minutes on 2 cores, so `slow`):
- DPO `loss_type: ipo`, `apo_zero`, and RPO (`[sigmoid, sft]` with `loss_weights`);
- GRPO `loss_type: dr_grpo`, and GSPO (`importance_sampling_level: sequence`);
- ORPO (`kind: orpo`) and SimPO (`kind: cpo`, `loss_type: simpo`, `cpo_alpha: 0`), TRL's experimental
  trainers, reference-free.
The plan names each loss in words and counts no reference for the reference-free kinds; the defaults the
plan assumes are TRL's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trl
import yaml

from align.cli import main
from align.models.loading import resolve_model
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.losses import DEFAULTS
from align.planning.placement import REFERENCE_COPY, REFERENCE_NONE
from align.planning.plan import build
from tests.pipelines import QUIET_TRL, run, stage_folder, stage_record

CPU = Hardware(accelerator=False, device_memory=80 * 2**30)
TOY = "align:toy/number-or-word"
PAIRS = {"train": f"{TOY}/prefs/train", "eval": f"{TOY}/prefs/test", "max_train_rows": 256}
RULES = [{"function": "exact_answer"}, {"function": "format"}]


def sft() -> dict:
    trl_block = {**QUIET_TRL, "max_steps": 40, "learning_rate": 1e-2, "per_device_train_batch_size": 32}
    return {"kind": "sft", "data": {"train": f"{TOY}/sft"}, "trl": {**trl_block, "assistant_only_loss": True}}


def pairs(kind: str, **trl_block) -> dict:
    block = {**QUIET_TRL, "max_steps": 8, "learning_rate": 2e-3, "per_device_train_batch_size": 8}
    return {"kind": kind, "model": "${stages.sft.output}", "data": PAIRS, "trl": {**block, **trl_block}}


def grpo(**trl_block) -> dict:
    block = {key: value for key, value in QUIET_TRL.items() if key != "max_length"}
    block |= {"max_steps": 15, "learning_rate": 2e-3, "per_device_train_batch_size": 16}
    block |= {"num_generations": 8, "max_completion_length": 8}
    data = {"train": f"{TOY}/train", "eval": f"{TOY}/test"}
    return {
        "kind": "grpo",
        "model": "${stages.sft.output}",
        "data": data,
        "rewards": RULES,
        "trl": {**block, **trl_block},
    }


STAGES = {
    "sft": sft(),
    "ipo": pairs("dpo", loss_type="ipo", beta=0.1),
    "apo_zero": pairs("dpo", loss_type="apo_zero"),
    "rpo": pairs("dpo", loss_type=["sigmoid", "sft"], loss_weights=[1.0, 1.0]),
    "dr_grpo": grpo(loss_type="dr_grpo"),
    "gspo": grpo(importance_sampling_level="sequence"),
    "orpo": pairs("orpo", beta=0.1),
    "simpo": pairs("cpo", loss_type="simpo", cpo_alpha=0.0, beta=2.0, simpo_gamma=0.5),
}


def write(folder: Path) -> Path:
    body = {"name": "variants", "base_model": "tiny", "defaults": {"output_root": str(folder / "runs")}}
    path = folder / "variants.yaml"
    path.write_text(yaml.safe_dump({**body, "stages": STAGES}, sort_keys=False))
    return path


# --- the plan: no weights load ---


def test_the_plan_names_each_loss_and_counts_no_reference_for_orpo_and_simpo(tmp_path, capsys) -> None:
    resolve_model("tiny")  # built: the plan prices a builtin once it is here
    path = write(tmp_path)
    plan = build(load(path), CPU).stages
    assert plan["ipo"].loss == "IPO (squared distance of the margin to 1/(2 beta), reference-based)"
    rpo = plan["rpo"].loss
    assert rpo.startswith("RPO: 1 x DPO (sigmoid") and " + 1 x SFT (negative log-likelihood" in rpo
    assert plan["apo_zero"].loss.startswith("APO-zero")
    assert plan["dr_grpo"].loss.startswith("Dr. GRPO (token losses over a constant")
    assert plan["gspo"].loss.startswith("GSPO: sequence-level importance ratio, DAPO")
    assert plan["orpo"].loss.startswith("ORPO") and "reference-free" in plan["orpo"].loss
    assert plan["simpo"].loss == "SimPO (length-normalised margin over the target gamma, reference-free)"
    for name in ("orpo", "simpo"):
        assert plan[name].placement.reference == REFERENCE_NONE
        assert "reference" not in plan[name].placement.description
        assert plan[name].memory.device.frozen == 0
    assert plan["ipo"].placement.reference == REFERENCE_COPY  # a full-parameter DPO keeps its copy
    assert plan["ipo"].memory.device.frozen > 0
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "    loss: SimPO (length-normalised margin" in out[out.index("kind=cpo") :]


def test_the_defaults_the_plan_assumes_are_trls() -> None:
    from trl.experimental.cpo import CPOConfig

    configs = {
        "dpo": trl.DPOConfig,
        "grpo": trl.GRPOConfig,
        "cpo": CPOConfig,
        "distill": trl.DistillationConfig,
    }
    for kind, settings in DEFAULTS.items():
        fields = configs[kind].__dataclass_fields__
        for key, value in settings.items():
            default = (
                fields[key].default_factory()
                if callable(fields[key].default_factory)
                else fields[key].default
            )
            assert default == value, (kind, key)


def test_a_simpo_block_is_checked_by_trls_cpo_config(tmp_path, capsys) -> None:
    stages = {"sft": sft(), "simpo": pairs("cpo", loss_type="simpo", cpo_alpha=0.0, simpo_gama=0.5)}
    body = {"name": "bad", "base_model": "tiny", "defaults": {"output_root": str(tmp_path)}, "stages": stages}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(body))
    assert main(["validate", str(path)]) == 2
    assert "stages.simpo.trl.simpo_gama: unknown CPOConfig field 'simpo_gama'" in capsys.readouterr().err


# --- one run, every variant ---


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> Path:
    path = write(tmp_path_factory.mktemp("variants"))
    run(path, timeout=1800)
    return path


@pytest.mark.integration
@pytest.mark.slow
def test_ipo_moves_the_reference_margin_towards_its_target(variants) -> None:
    metrics = stage_record(variants, "ipo")["metrics"]
    assert metrics["dpo_reward_ties_before"] == 1.0  # the policy starts as its reference
    assert 0 < metrics["dpo_reward_margin_after"] < 1 / (2 * 0.1)
    assert metrics["dpo_reward_accuracy_after"] > 0.6
    assert metrics["train_loss_last"] < metrics["train_loss_first"]


@pytest.mark.integration
@pytest.mark.slow
def test_apo_zero_raises_chosen_and_lowers_rejected_against_the_reference(variants) -> None:
    metrics = stage_record(variants, "apo_zero")["metrics"]
    assert metrics["dpo_reward_chosen_after"] > 0 > metrics["dpo_reward_rejected_after"]


@pytest.mark.integration
@pytest.mark.slow
def test_rpo_raises_the_log_probability_of_chosen(variants) -> None:
    metrics = stage_record(variants, "rpo")["metrics"]
    assert metrics["chosen_logprob_after"] > metrics["chosen_logprob_before"]
    assert metrics["dpo_reward_accuracy_after"] > 0.6


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("stage", ["dr_grpo", "gspo"])
def test_grpo_variants_raise_the_held_out_reward(variants, stage: str) -> None:
    metrics = stage_record(variants, stage)["metrics"]
    assert metrics["reward_mean_after"] > metrics["reward_mean_before"] + 0.1
    assert metrics["reward_exact_answer_after"] > metrics["reward_exact_answer_before"] - 0.1


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("stage", ["orpo", "simpo"])
def test_reference_free_variants_widen_the_policys_own_margin(variants, stage: str) -> None:
    record = stage_record(variants, stage)
    metrics = record["metrics"]
    assert metrics["preference_margin_after"] > metrics["preference_margin_before"]
    assert metrics["preference_accuracy_after"] >= metrics["preference_accuracy_before"]
    assert metrics["reference_copy_loaded"] == 0.0 and metrics["trainable_changed"] == 1.0
    frozen = next(row for row in record["memory_plan"] if row["what"] == "frozen models")
    assert frozen["device"] == frozen["host"] == 0


@pytest.mark.integration
@pytest.mark.slow
def test_the_report_holds_every_variant(variants) -> None:
    assert main(["report", str(variants)]) == 0
    page = (stage_folder(variants, "sft").parent / "report.md").read_text()
    for stage in STAGES:
        assert f"\n## {stage}\n" in page, stage
