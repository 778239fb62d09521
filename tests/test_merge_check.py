"""The merge check measures the merge, not the float noise: a right merge of chained LoRA adapters at the
recipes' magnitudes passes the default bounds, and a dropped or mis-scaled adapter fails them, in a line that
names the YAML keys (issue 37)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from align.config.spec import MergeStage
from align.errors import StageFailed
from align.models.loading import load_causal_lm, load_tokenizer, resolve_model
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.launch import launch_of
from align.planning.plan import ModelInput, StageInputs, build
from align.stages import runner_for
from align.stages.context import StageContext
from align.stages.merge import MergeCheck, check_problems, failure_line, measure, prompt_logits

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
DEFAULTS = MergeStage(kind="merge", model="${stages.dpo.output}")


def trained_like(model_dir: str, folder: Path, *, lr: float, steps: int, seed: int) -> Path:
    """A LoRA r16 all-linear adapter whose B moved as `steps` Adam steps at `lr` would (about lr a step)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    model = get_peft_model(load_causal_lm(model_dir, dtype=torch.float32), config)
    for name, weight in model.named_parameters():
        if "lora_B" in name:
            weight.data.normal_(0, lr * steps)
    model.save_pretrained(folder)
    load_tokenizer(model_dir).save_pretrained(folder)  # as a stage saves it
    return folder


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> tuple[str, Path, Path]:
    """The tiny model, an SFT adapter (20 steps at 2e-4) and a DPO one on top (16 steps at 1e-4)."""
    from peft import PeftModel

    folder = tmp_path_factory.mktemp("chain")
    base = resolve_model("tiny")
    sft = trained_like(base, folder / "sft", lr=2e-4, steps=20, seed=1)
    merged_sft = PeftModel.from_pretrained(load_causal_lm(base, dtype=torch.float32), sft).merge_and_unload()
    merged_sft.save_pretrained(folder / "sft-merged")
    load_tokenizer(base).save_pretrained(folder / "sft-merged")
    dpo = trained_like(str(folder / "sft-merged"), folder / "dpo", lr=1e-4, steps=16, seed=2)
    return base, sft, dpo


def adapter_model(chain):
    """The merge stage's reference: the earlier adapter merged, the last one on top."""
    from peft import PeftModel

    base, sft, dpo = chain
    return PeftModel.from_pretrained(
        PeftModel.from_pretrained(load_causal_lm(base, dtype=torch.float32), sft).merge_and_unload(), dpo
    )


def figures(chain, *, corrupt=None, drop: bool = False) -> MergeCheck:
    """The check's figures of the chain's merge; `corrupt` edits the adapter model after the reference
    logits are taken, `drop` unloads the last adapter instead of merging it."""
    tokenizer = load_tokenizer(chain[0])
    adapted = adapter_model(chain)
    before = prompt_logits(adapted, tokenizer, DEFAULTS.check_prompts)
    if corrupt is not None:
        corrupt(adapted)
    merged = adapted.unload() if drop else adapted.merge_and_unload()
    return measure(before, prompt_logits(merged, tokenizer, DEFAULTS.check_prompts))


def test_a_right_merge_of_chained_adapters_passes_the_default_bounds(chain):
    check = figures(chain)

    assert check_problems(check, DEFAULTS, "stages.merge") == []
    assert check.relative_delta < DEFAULTS.tolerance / 100 and check.greedy_agreement == 1.0
    assert check.max_kl < DEFAULTS.max_kl / 100


def double_the_scale(model) -> None:
    for name, weight in model.named_parameters():
        if "lora_B" in name:
            weight.data.mul_(2)


@pytest.mark.parametrize(
    "wrong", [{"drop": True}, {"corrupt": double_the_scale}], ids=["dropped-adapter", "doubled-scale"]
)
def test_a_wrong_merge_fails_on_the_logits_scale(chain, wrong):
    check = figures(chain, **wrong)

    problems = check_problems(check, DEFAULTS, "stages.merge")

    assert check.relative_delta > 10 * DEFAULTS.tolerance
    assert problems[0].startswith("relative logit delta") and "stages.merge.tolerance 0.001" in problems[0]


def test_the_failure_line_gives_the_figures_and_names_each_broken_bound():
    check = MergeCheck(
        max_abs_delta=0.5, relative_delta=0.0134, max_kl=0.0014, greedy_agreement=0.9, largest_logit=37.8
    )

    line = failure_line(check, check_problems(check, DEFAULTS, "stages.fold"))

    for words in (
        "relative logit delta 0.0134 > stages.fold.tolerance 0.001",
        "next-token KL 0.0014 > stages.fold.max_kl 1e-05",
        "greedy agreement 0.9 < stages.fold.min_greedy_agreement 0.95",
        "max abs logit delta 0.5 with logits up to 37.8",
        "not published",
    ):
        assert words in line
    assert check.metrics()["merge_max_abs_logit_delta"] == 0.5


def merge_context(tmp_path: Path, chain, **merge_keys) -> StageContext:
    base, sft, dpo = chain
    stage = {"kind": "sft", "data": {"train": "align:chatterbot/sft/train"}, "lora": {"r": 16}}
    merge = {"kind": "merge", "model": "${stages.sft.output}", **merge_keys}
    body = {"name": "m", "base_model": base, "stages": {"sft": stage, "merge": merge}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(body))  # only the merge runs, on the adapters made here
    plan = build(load(tmp_path / "m.yaml"), CPU).stages["merge"]
    launch = launch_of(plan, StageInputs(ModelInput(base, (str(sft), str(dpo)))))
    return StageContext(plan=plan, output_dir=tmp_path / "out", launch=launch)


def test_the_merge_stage_records_the_figures(tmp_path, chain):
    result = runner_for("merge").run(merge_context(tmp_path, chain))

    assert set(result.metrics) >= {
        "merge_max_abs_logit_delta",
        "merge_relative_logit_delta",
        "merge_max_kl",
        "merge_greedy_agreement",
    }
    assert result.metrics["merge_greedy_agreement"] == 1.0 and result.metrics["adapters_merged"] == 2.0


def test_a_merge_stage_that_drops_its_adapter_fails_and_publishes_nothing(tmp_path, chain, monkeypatch):
    from peft.tuners.lora import LoraModel

    # every "merge" unloads instead: the earlier adapter is gone from both sides, the last from the merged one
    monkeypatch.setattr(LoraModel, "merge_and_unload", LoraModel.unload)

    with pytest.raises(StageFailed, match=r"> stages\.merge\.tolerance 0\.001;.*\(measured: max abs"):
        runner_for("merge").run(merge_context(tmp_path, chain))
    assert not (tmp_path / "out" / "model").exists()
