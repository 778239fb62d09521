"""ZeRO-2: the DeepSpeed config generated from a stage, the shipped presets, and runs that prove sharding.

The integration tests run the real CLI on 2 Ray workers and read each rank's placement report: every
rank must hold about half of Adam's two moments, inside DeepSpeed's ZeRO optimizer.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from align.backends import BACKENDS, zero2
from align.backends.sharding_report import ShardingReport
from align.backends.zero2_check import ZeroOptimizerCheck
from align.config.spec import KINDS, Pipeline
from align.errors import ConfigError
from align.planning.hardware import Hardware
from align.planning.plan import StagePlan, build
from tests.pipelines import PREF_DATA, placement_reports, run, stage, stage_record, write_pipeline

PRESETS = Path(__file__).resolve().parents[1] / "configs" / "deepspeed"
CPU_HOST = Hardware(accelerator=False, device_memory=80 * 2**30)
LORA = {"r": 8}
AUTO_ADAMW = {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}
FEW_PAIRS = {**PREF_DATA, "max_train_rows": 32, "max_eval_rows": 8}  # DPO scores the eval pairs twice


def zero2_plan(**fields) -> StagePlan:
    """The plan of one DPO stage under backend zero2 on 2 CPU ranks; nothing is loaded."""
    body = {"kind": "dpo", "data": {"train": "prefs.jsonl"}, "backend": "zero2", "workers": 2, **fields}
    stage = KINDS["dpo"].spec.model_validate(body)
    pipeline = Pipeline(name="p", base_model="tiny", stages={"dpo": stage})
    return build(pipeline, CPU_HOST).stages["dpo"]


def preset(name: str) -> dict:
    return json.loads((PRESETS / name).read_text())


def test_lora_offloads_the_optimizer_to_a_deepspeed_adamw_by_default() -> None:
    for lora in (LORA, {"r": 8, "load_in_4bit": True}):
        config = zero2.deepspeed_config(zero2_plan(lora=lora))
        assert config["zero_optimization"] == {
            "stage": 2,
            "offload_optimizer": {"device": "cpu", "pin_memory": False},
            "overlap_comm": True,
            "contiguous_gradients": True,
            "reduce_bucket_size": 50_000_000,
            "allgather_bucket_size": 50_000_000,
        }
        # without this entry DeepSpeed refuses the torch AdamW that HF would build for ZeRO-Offload
        assert config["optimizer"] == {"type": "AdamW", "params": AUTO_ADAMW}


def test_full_parameters_keep_the_optimizer_on_device_and_let_hf_build_it() -> None:
    config = zero2.deepspeed_config(zero2_plan())
    assert "offload_optimizer" not in config["zero_optimization"]
    assert "optimizer" not in config


@pytest.mark.parametrize(
    ("lora", "setting", "offloaded"),
    [(LORA, "none", False), (LORA, "cpu", True), (None, "cpu", True), (None, "none", False)],
)
def test_offload_optimizer_setting_is_honoured(lora, setting, offloaded) -> None:
    config = zero2.deepspeed_config(zero2_plan(lora=lora, zero2={"offload_optimizer": setting}))
    assert ("offload_optimizer" in config["zero_optimization"]) is offloaded
    assert ("optimizer" in config) is offloaded


def test_zero2_block_settings_reach_deepspeed() -> None:
    settings = {"overlap_comm": False, "contiguous_gradients": False, "bucket_size": 2_000_000}
    zero = zero2.deepspeed_config(zero2_plan(zero2=settings))["zero_optimization"]
    assert (zero["overlap_comm"], zero["contiguous_gradients"]) == (False, False)
    assert zero["reduce_bucket_size"] == zero["allgather_bucket_size"] == 2_000_000


def test_training_arguments_stay_the_source_of_truth_for_batch_and_clipping() -> None:
    config = zero2.deepspeed_config(zero2_plan(lora=LORA))
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size"):
        assert config[key] == "auto"
    assert config["gradient_clipping"] == "auto"
    assert "scheduler" not in config  # HF builds the schedule from TrainingArguments


@pytest.mark.parametrize(("precision", "sections"), [("fp32", set()), ("bf16", {"bf16"}), ("fp16", {"fp16"})])
def test_precision_section_follows_the_plan(precision, sections) -> None:
    config = zero2.deepspeed_config(zero2_plan(precision=precision))
    assert {key for key in ("bf16", "fp16") if key in config} == sections
    assert all(config[key] == {"enabled": True} for key in sections)


def test_generated_configs_match_the_shipped_presets() -> None:
    """So the JSON files users copy and the configs align generates never drift apart."""
    for plan, name in ((zero2_plan(lora=LORA), "zero2_offload.json"), (zero2_plan(), "zero2.json")):
        generated, shipped = zero2.deepspeed_config(plan), preset(name)
        assert generated["zero_optimization"] == shipped["zero_optimization"]
        assert generated.get("optimizer") == shipped.get("optimizer")
        for key in zero2.AUTO_BATCH:
            assert generated[key] == shipped[key] == "auto"
        assert shipped["bf16"] == shipped["fp16"] == {"enabled": "auto"}


def test_a_named_json_is_used_as_it_is() -> None:
    for name in ("zero2_offload.json", "zero2.json"):
        plan = zero2_plan(lora=LORA, zero2={"config": str(PRESETS / name)})
        assert BACKENDS["zero2"].trainer_args(plan) == {"deepspeed": preset(name)}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read DeepSpeed config"),
        ("{not json", "is not valid JSON"),
        ('{"zero_optimization": {"stage": 3}}', "zero_optimization.stage=3; backend zero2 needs stage 2"),
        ("[2]", "zero_optimization.stage=None"),
        (
            '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}',
            "offloads the optimizer but has no `optimizer` entry",
        ),
    ],
)
def test_a_bad_named_json_is_refused_with_its_yaml_path(tmp_path, content, message) -> None:
    path = tmp_path / "ds.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        zero2.deepspeed_config(zero2_plan(zero2={"config": str(path)}))
    [problem] = caught.value.problems
    assert problem.path == "stages.dpo.zero2.config"
    assert str(path) in problem.message and message in problem.message


def test_offload_without_an_optimizer_entry_is_accepted_when_the_user_waives_it(tmp_path) -> None:
    body = {"zero_force_ds_cpu_optimizer": False, "zero_optimization": {"stage": 2, "offload_optimizer": {}}}
    (tmp_path / "ds.json").write_text(json.dumps(body))
    plan = zero2_plan(zero2={"config": str(tmp_path / "ds.json")})
    assert zero2.deepspeed_config(plan) == body
    check, report = BACKENDS["zero2"].callbacks(plan, tmp_path)
    assert not check.on_host and isinstance(report, ShardingReport)


def test_callbacks_check_the_optimizer_then_report_placement(tmp_path) -> None:
    for plan, on_host in ((zero2_plan(lora=LORA), True), (zero2_plan(), False)):
        check, report = BACKENDS["zero2"].callbacks(plan, tmp_path)
        assert isinstance(check, ZeroOptimizerCheck) and check.on_host is on_host
        assert isinstance(report, ShardingReport)


def test_the_check_fails_loudly_when_deepspeed_did_not_take_over() -> None:
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(RuntimeError, match="AdamW, not DeepSpeedZeroOptimizer"):
        ZeroOptimizerCheck(on_host=False).on_train_begin(None, None, None, optimizer=adamw)
    zero = object.__new__(DeepSpeedZeroOptimizer)  # only its class and `.optimizer` are looked at
    zero.optimizer = adamw
    wrapped = SimpleNamespace(optimizer=zero)  # as accelerate's DeepSpeedOptimizerWrapper holds it
    ZeroOptimizerCheck(on_host=False).on_train_begin(None, None, None, optimizer=wrapped)
    with pytest.raises(RuntimeError, match="ZeRO steps with AdamW, not DeepSpeedCPUAdam"):
        ZeroOptimizerCheck(on_host=True).on_train_begin(None, None, None, optimizer=wrapped)


# Every case runs on CPU ranks over gloo; the `cuda` variant runs them unchanged on 2 GPUs over NCCL.
# One `align run` holds all four cases as stages, so Ray and the workers start once per device.
DEVICES = [
    pytest.param("cpu", marks=pytest.mark.integration),
    pytest.param("cuda", marks=[pytest.mark.integration, pytest.mark.gpu(devices=2)]),
]
FEW_SFT_ROWS = {"train": "align:chatterbot/sft/train", "max_train_rows": 64}
CASES = {
    # through the shipped offload preset, so the file users copy is known to run
    "lora_dpo": dict(lora=LORA, workers=2, zero2={"config": str(PRESETS / "zero2_offload.json")}),
    "qlora_dpo": dict(lora={"r": 8, "load_in_4bit": True}, workers=2),
    # no eval split: a held-out slice, scored at the start of train() (HF's evaluate() before train()
    # refuses ZeRO-1/2: "ZeRO inference only makes sense with ZeRO Stage 3")
    "full_sft": dict(kind="sft", data=FEW_SFT_ROWS, workers=2),
    # one rank is planned as ddp unless zero2 is named; named, it must still run (unsharded)
    "one_rank": dict(lora=LORA, workers=1),
}


@pytest.fixture(scope="module", params=DEVICES)
def zero2_run(request, tmp_path_factory) -> Path:
    """The four cases as stages of one pipeline, run through the CLI; returns its file."""
    stages = {}
    for name, fields in CASES.items():
        settings = {"data": FEW_PAIRS, "backend": "zero2", **fields}
        stages[name] = stage(settings.pop("kind", "dpo"), steps=3, **settings)
    path = write_pipeline(tmp_path_factory.mktemp("zero2"), "zero2", stages)
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "cpu":
            patch.setenv("CUDA_VISIBLE_DEVICES", "")  # the controller picks gloo and fp32 without CUDA
        run(path)
    return path


def case_reports(path: Path, name: str) -> list[dict]:
    """Each rank's placement report for one case, after checking it really ran under zero2."""
    assert stage_record(path, name)["resolved"]["backend"] == "zero2"
    return placement_reports(path, name)


def assert_states_sharded(reports: list[dict], world_size: int, optimizer: str) -> None:
    """Each rank holds 1/world_size of Adam's two moments, inside DeepSpeed's ZeRO optimizer.

    ZeRO-2 pads each parameter group's flat buffer to a multiple of 2 x world_size elements, so a
    rank may hold a few elements more than an exact share.
    """
    assert [report["rank"] for report in reports] == list(range(world_size))
    both_moments = 2 * reports[0]["trainable_elements_total"]
    for report in reports:
        assert report["world_size"] == world_size
        assert (report["wrapper"], report["optimizer"]) == ("DeepSpeedZeroOptimizer", optimizer)
        assert report["optimizer_state_elements_local"] == pytest.approx(both_moments / world_size, rel=0.05)
    assert sum(report["optimizer_state_elements_local"] for report in reports) >= both_moments


def test_lora_dpo_shards_offloaded_optimizer_states(zero2_run) -> None:
    assert_states_sharded(case_reports(zero2_run, "lora_dpo"), 2, "DeepSpeedCPUAdam")


def test_qlora_dpo_shards_offloaded_optimizer_states(zero2_run) -> None:
    assert_states_sharded(case_reports(zero2_run, "qlora_dpo"), 2, "DeepSpeedCPUAdam")


def test_full_parameter_sft_shards_optimizer_states_without_offload(zero2_run) -> None:
    assert_states_sharded(case_reports(zero2_run, "full_sft"), 2, "AdamW")


def test_zero2_named_explicitly_runs_on_one_rank(zero2_run) -> None:
    assert_states_sharded(case_reports(zero2_run, "one_rank"), 1, "DeepSpeedCPUAdam")


def test_held_out_metrics_are_measured_before_and_after_under_zero2(zero2_run) -> None:
    sft = stage_record(zero2_run, "full_sft")["metrics"]
    assert sft["eval_loss_after"] < sft["eval_loss_before"]
    for name in ("lora_dpo", "qlora_dpo"):
        dpo = stage_record(zero2_run, name)["metrics"]
        assert dpo["dpo_reward_margin_before"] == 0.0  # policy = reference: every pair ties
        assert dpo["dpo_reward_accuracy_before"] == 0.5 and dpo["dpo_reward_ties_before"] == 1.0
        assert dpo["dpo_reward_margin_after"] != 0.0  # and measured again once trained
