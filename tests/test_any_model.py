"""Planning models that are not a Llama: counts from the model's own class on the meta device (published
configs of five families), LoRA targets resolved against the model's modules and refused by name, MoE
experts adapted or left out as the plan says, and fsdp chosen for LoRA where a replica of the base cannot
fit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from align.cli import main
from align.models.architectures import PRESETS, architecture_for
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.plan import build
from tests.families import build_family
from tests.pipelines import stage, write_pipeline

GB = 10**9
GPUS_80GB = Hardware(accelerator=True, device_memory=80 * GB, bf16=True)
MIXTRAL = "pipelines/sft_mixtral_lora.yaml"


@pytest.mark.parametrize(
    ("preset", "params"),
    [
        ("qwen2.5-7b", 7_615_616_512),
        ("qwen3-8b", 8_190_735_360),
        ("mixtral-8x7b", 46_702_792_704),
        ("gemma2-9b", 9_241_705_984),  # tied embeddings, counted once
        ("phi3-mini", 3_821_079_552),  # fused qkv_proj and gate_up_proj
    ],
)
def test_published_configs_count_as_their_model_cards_say(preset: str, params: int) -> None:
    assert PRESETS[preset].param_count() == params


def test_hub_ids_find_their_published_config() -> None:
    assert architecture_for("mistralai/Mixtral-8x7B-Instruct-v0.1") is PRESETS["mixtral-8x7b"]
    assert architecture_for("Qwen/Qwen2.5-7B-Instruct") is PRESETS["qwen2.5-7b"]


def test_mixtral_lora_on_8x80gb_shards_its_base_with_fsdp(capsys) -> None:
    """Its bf16 base is 93 GB: no replica fits an 80 GB rank, so `auto` takes fsdp, priced at 1/8 a rank."""
    sft = build(load(MIXTRAL), GPUS_80GB).stages["sft"]
    assert sft.backend == "fsdp"
    assert (
        "on 46.7B" in sft.backend_reason and "ZeRO-2 with CPU optimizer offload needs" in sft.backend_reason
    )
    base = 2 * PRESETS["mixtral-8x7b"].param_count()  # bf16
    adapters = 4 * sft.memory.trainable_params  # fp32, whole on every rank
    assert sft.memory.device.params == -(-base // 8) + adapters
    zero2 = sft.memory_by_backend["zero2+offload"]
    assert zero2.device.params >= base  # a whole bf16 replica on every rank
    assert main(["plan", MIXTRAL, "--device-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "all-linear: k_proj, o_proj, q_proj, v_proj; MoE weights too: experts.down_proj" in out


def test_experts_are_left_out_when_the_targets_do_not_name_them() -> None:
    attention = build(load(MIXTRAL, ["stages.sft.lora.target_modules=[q_proj,v_proj]"]), GPUS_80GB)
    named = build(load(MIXTRAL, ["stages.sft.lora.target_modules=[q_proj,experts.gate_up_proj]"]), GPUS_80GB)
    assert "MoE weights left out" in attention.stages["sft"].lora_targets.summary
    assert named.stages["sft"].lora_targets.parameters == ("experts.gate_up_proj",)
    assert named.stages["sft"].memory.trainable_params > 10 * attention.stages["sft"].memory.trainable_params


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return build_family("gpt2", tmp_path_factory.mktemp("gpt2"))


def test_gpt2_plans_with_its_own_module_names(gpt2: Path, tmp_path: Path, capsys) -> None:
    path = write_pipeline(tmp_path, "gpt2", {"sft": stage("sft", model=str(gpt2), lora={"r": 4})})
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "lora targets: all-linear: c_attn, c_fc, c_proj" in out
    assert "Traceback" not in out


def test_a_target_the_model_lacks_is_refused_at_validate_listing_its_names(
    gpt2: Path, tmp_path: Path, capsys
):
    lora = {"r": 4, "target_modules": ["q_proj", "c_attn"]}
    path = write_pipeline(tmp_path, "gpt2", {"sft": stage("sft", model=str(gpt2), lora=lora)})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "stages.sft.lora.target_modules: LoRA target_modules ['q_proj'] not in this gpt2 model" in err
    assert "['c_attn', 'c_fc', 'c_proj']" in err


def test_counts_are_cached_so_a_second_plan_imports_no_torch(gpt2: Path, tmp_path: Path) -> None:
    path = write_pipeline(tmp_path, "gpt2", {"sft": stage("sft", model=str(gpt2), lora={"r": 4})})
    code = (
        "import sys; from align.cli import main\n"
        f"assert main(['plan', {str(path)!r}]) == 0\n"
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    env = {"ALIGN_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    seen = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        seen.append(done.stdout.strip().splitlines()[-1])
    assert seen == ["TORCH True", "TORCH False"]
    cached = list((tmp_path / "cache" / "model-counts").glob("*.json"))
    assert len(cached) == 1 and json.loads(cached[0].read_text())["model"]["model_type"] == "gpt2"


def test_conversations_for_a_base_model_without_a_chat_template_are_refused_at_validate(tmp_path, capsys):
    """Llama-3-8B, Qwen2.5-7B base and Mistral-7B-v0.1 ship no template: say so before any model loads."""
    folder = build_family("qwen2", tmp_path)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    (tmp_path / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    (tmp_path / "text.jsonl").write_text(json.dumps({"text": "Hi. Hello."}) + "\n")
    for data, expected in (("chat.jsonl", 2), ("text.jsonl", 0)):
        sft = {"kind": "sft", "model": str(folder), "data": {"train": str(tmp_path / data)}}
        path = write_pipeline(tmp_path, "base", {"sft": sft})
        assert main(["validate", str(path)]) == expected
    err = capsys.readouterr().err
    assert (
        f"stages.sft.data.train: its rows are conversations, but the model {folder} has no chat template"
        in err
    )
