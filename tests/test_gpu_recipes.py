"""The GPU-scale recipes (recipes/gpu/) validate and plan here, with no hub and no GPU, and what `align plan`
prints per rank is the arithmetic a reader can redo: parameters counted from the published config.json by
hand, times bytes per parameter, over the ranks. Also the GSM8K recipe's reward, `final_number`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from align.cli import main
from align.models.memory import format_bytes
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.plan import PROMPT_TOKENS, build
from align.rewards import args_problem, final_number, final_number_of

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes" / "gpu"
PRESETS = ROOT / "configs" / "models"
GB = 10**9
RANKS = 8
ROWS = ("parameters", "gradients", "optimizer states", "fp32 master copy", "frozen models", "activations")


def config(preset: str) -> dict:
    return json.loads((PRESETS / preset / "config.json").read_text())


def shapes(c: dict) -> tuple[int, int, int, int, int, int]:
    """(hidden, query width, key/value width, intermediate, layers, vocab) of a Llama/Qwen2 config."""
    head = c["hidden_size"] // c["num_attention_heads"]
    return (
        c["hidden_size"],
        c["num_attention_heads"] * head,
        c["num_key_value_heads"] * head,
        c["intermediate_size"],
        c["num_hidden_layers"],
        c["vocab_size"],
    )


def parameters(c: dict) -> int:
    """Every weight of a Llama/Qwen2 decoder by hand: q, k, v, o (Qwen2 adds q/k/v biases), the gated MLP's
    three matrices, two norms per layer; the embeddings, an untied head and the final norm."""
    h, q, kv, inter, layers, vocab = shapes(c)
    biases = q + 2 * kv if c["model_type"] == "qwen2" else 0
    layer = h * q + 2 * h * kv + q * h + biases + 3 * h * inter + 2 * h
    head = 0 if c.get("tie_word_embeddings") else vocab * h
    return layers * layer + vocab * h + head + h


def lora_parameters(c: dict, r: int) -> int:
    """LoRA's A (r x in) and B (out x r) on each of the seven linears of every layer (all-linear)."""
    h, q, kv, inter, layers, _ = shapes(c)
    linears = [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]
    return layers * sum(r * (into + out) for into, out in linears)


def activations(c: dict, micro_batch: int, seq: int) -> int:
    """Checkpointed activations at 16 bits (Korthikanti et al. 2022, without the s^2 scores SDPA never
    stores): each layer's input kept (2sbh bytes), one layer's 34sbh while it is recomputed, and the logits
    at 2 + 4 + 4 bytes each (their fp32 upcast and the saved log-softmax)."""
    h, _, _, _, layers, vocab = shapes(c)
    tokens = micro_batch * seq
    return layers * 2 * tokens * h + 34 * tokens * h + 10 * tokens * vocab


def shard(num_bytes: int) -> int:
    return math.ceil(num_bytes / RANKS)


def zero2(psi: int) -> dict[str, int]:
    """ZeRO-2 over bf16 weights: weights whole on each rank (2Ψ), the bf16 gradient partition beside its
    fp32 copy (2Ψ/N + 4Ψ/N), Adam's moments (8Ψ/N) and DeepSpeed's fp32 master partition (4Ψ/N)."""
    return {
        "parameters": 2 * psi,
        "gradients": shard(2 * psi) + shard(4 * psi),
        "optimizer states": shard(8 * psi),
        "fp32 master copy": shard(4 * psi),
    }


def chosen_column(output: str, stage: str) -> tuple[str, dict[str, str]]:
    """The backend `align plan` marked with `*` for a stage, and that column's cell in each row."""
    block = output.split(f". {stage}  kind=", 1)[1].split("\n")
    header = next(line for line in block if line.startswith("    per rank"))
    cells = [header[start : start + 20].strip() for start in range(20, len(header), 20)]
    index = next(i for i, cell in enumerate(cells) if cell.startswith("*"))
    rows = {}
    for line in block[block.index(header) + 1 :]:
        if not line.startswith("    ") or line.startswith("    per rank"):
            break
        rows.setdefault(line[:20].strip(), line[20 + 20 * index : 40 + 20 * index].strip())
    return cells[index].lstrip("*"), rows


def plan(name: str):
    return build(load(str(RECIPES / name)), Hardware(accelerator=True, device_memory=80 * GB, bf16=True))


def planned(capsys, name: str) -> str:
    assert main(["validate", str(RECIPES / name)]) == 0
    assert "valid pipeline" in capsys.readouterr().out
    assert main(["plan", str(RECIPES / name), "--device-memory", "80GB"]) == 0
    return capsys.readouterr().out


def assert_rows(output: str, stage_plan, expected: dict[str, int], backend: str) -> None:
    """Each row of the chosen column is the expected arithmetic, in the plan and as printed."""
    shown, cells = chosen_column(output, stage_plan.name)
    assert shown == backend == stage_plan.backend
    device = stage_plan.memory.device
    fields = dict(zip(ROWS, ("params", "grads", "optimizer", "master", "frozen", "activations"), strict=True))
    expected = {row: expected.get(row, 0) for row in ROWS}
    assert {row: getattr(device, fields[row]) for row in ROWS} == expected
    for row, value in expected.items():
        assert cells[row].split(" [")[0] == format_bytes(value), row
    assert cells["total"].split(" [")[0] == format_bytes(sum(expected.values()))


def test_the_presets_hold_the_published_parameter_counts() -> None:
    assert parameters(config("llama3-8b")) == 8_030_261_248
    assert parameters(config("qwen2.5-7b")) == 7_615_616_512
    assert parameters(config("llama3-70b")) == 70_553_706_496


def test_llama3_8b_sft_then_dpo_plan_zero2_with_a_replicated_reference(capsys) -> None:
    output = planned(capsys, "llama3_8b_sft_dpo.yaml")
    found = plan("llama3_8b_sft_dpo.yaml")
    c = config("llama3-8b")
    psi = parameters(c)
    assert found.stages["sft"].memory.trainable_params == psi
    sft = {**zero2(psi), "activations": activations(c, 4, 2048)}
    assert_rows(output, found.stages["sft"], sft, "zero2")
    dpo = found.stages["dpo"]
    assert dpo.placement.description["reference"] == "frozen copy, replicated on every rank"
    # a pair is two sequences: 2 pairs per device are 4 sequences of 2048 tokens
    assert_rows(output, dpo, {**sft, "frozen models": 2 * psi}, "zero2")
    total = sum({**sft, "frozen models": 2 * psi}.values())
    assert f"ZeRO-2 needs {format_bytes(total)}/rank <= 72.0 GB usable" in dpo.backend_reason


def test_qwen25_7b_grpo_on_gsm8k_plans_zero2_without_a_reference(capsys) -> None:
    output = planned(capsys, "qwen25_7b_grpo_gsm8k.yaml")
    grpo = plan("qwen25_7b_grpo_gsm8k.yaml").stages["grpo"]
    c = config("qwen2.5-7b")
    psi = parameters(c)
    seq = PROMPT_TOKENS + 512  # the plan's assumed prompt plus max_completion_length
    assert_rows(output, grpo, {**zero2(psi), "activations": activations(c, 8, seq)}, "zero2")
    assert "reference" not in grpo.placement.description  # beta 0: no KL term, no reference model
    assert "rewards[0] final_number: a function (no model memory)" in output
    assert "data: columns question -> prompt" in output


def test_llama3_70b_lora_sft_plans_fsdp_with_the_base_sharded(capsys) -> None:
    output = planned(capsys, "llama3_70b_lora_sft.yaml")
    sft = plan("llama3_70b_lora_sft.yaml").stages["sft"]
    c = config("llama3-70b")
    psi, adapters = parameters(c), lora_parameters(c, 16)
    assert sft.memory.trainable_params == adapters
    # the bf16 base sharded over the ranks; the adapters whole on each, fp32 weights, grads and Adam moments
    expected = {
        "parameters": shard(2 * psi) + 4 * adapters,
        "gradients": 4 * adapters,
        "optimizer states": 8 * adapters,
        "activations": activations(c, 2, 2048),
    }
    assert_rows(output, sft, expected, "fsdp")
    # what rules ZeRO-2 out: the whole bf16 base and the bf16 adapters on every rank
    offloaded = sft.memory_by_backend["zero2+offload"]
    assert offloaded.device.params == 2 * psi + 2 * adapters
    assert (
        f"ZeRO-2 with CPU optimizer offload needs {format_bytes(offloaded.total)}/rank" in sft.backend_reason
    )


# --- the GSM8K recipe's reward ---


@pytest.mark.parametrize(
    ("completion", "answer", "score"),
    [
        ("48/2 = 24 in May, 48 + 24 = 72 in all.\n#### 72", "Natalia sold ... = 72 clips.\n#### 72", 1.0),
        ("The total is $1,234.00.", "#### 1234", 1.0),  # currency, thousands and cents
        ("so x = \\boxed{-3}, checked with 5", "-3", 1.0),  # a boxed answer counts, not the last number
        ("72 at first, then 73", "#### 72", 0.0),  # the final number is the answer
        ("I do not know", "#### 5", 0.0),
        ("#### 5", "no number here", 0.0),  # an answer with no number matches nothing
    ],
)
def test_final_number_compares_the_final_numbers(completion: str, answer: str, score: float) -> None:
    assert final_number([completion], answer=[answer]) == [score]
    assert final_number([[{"role": "assistant", "content": completion}]], answer=[answer]) == [score]


def test_final_number_reads_markers_and_needs_an_answer_column() -> None:
    assert final_number_of("a 1 b #### 2,500 c 7") == 2500
    assert final_number_of("none") is None
    with pytest.raises(ValueError, match="`answer` column"):
        final_number(["1"])
    assert args_problem("final_number", {}) is None
    assert "takes no argument 'tolerance'" in args_problem("final_number", {"tolerance": 0.1})
