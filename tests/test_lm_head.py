"""How TRL's trainers read the LM head, decided in the plan (align/planning/lora.py): TRL's fused head where
it can read the head, and the plain path (align/stages/lm_head.py) where peft wraps a tied head around the
chat template's trained token rows. The tiny Llama (tied embeddings) with its template removed, given
`chat_template: chatml` under LoRA, failed in its first step (`'TrainableTokensWrapper' object has no
attribute 'bias'`); here it trains SFT then DPO, and the adapters chat in plain transformers and peft."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.trainer.utils import add_fused_lm_head

from align.cli import main
from align.models.chat_templates import BUILTIN
from align.models.loading import resolve_model
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.launch import launch_of
from align.planning.lora import FUSED, PLAIN
from align.planning.plan import ModelInput, StageInputs, build
from align.stages import run_seeded
from align.stages.context import StageContext
from align.stages.lm_head import answer_from_logits
from tests.families import build_family
from tests.pipelines import stage, write_pipeline

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
FIELDS = ("loss", "log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1", "label_mask")
HI = [{"role": "user", "content": "Hi"}]


def template_less(folder: Path, source: Path) -> Path:
    """A copy of a model folder without a chat template: what a base model is to a user."""
    shutil.copytree(source, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    assert AutoTokenizer.from_pretrained(folder).chat_template is None
    return folder


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Path:
    """The tiny Llama (its LM head tied to its embeddings), without its template."""
    return template_less(tmp_path_factory.mktemp("models") / "tiny-bare", Path(resolve_model("tiny")))


@pytest.mark.parametrize("family", ["tiny", "gemma2", "mixtral"])  # tied; softcapped logits; MoE aux loss
def test_the_plain_path_answers_as_trls_fused_head(tmp_path, family):
    folder = resolve_model("tiny") if family == "tiny" else build_family(family, tmp_path)
    torch.manual_seed(0)
    fused = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    fused.config.output_router_logits = family == "mixtral"
    plain = copy.deepcopy(fused)
    wanted = FIELDS[2:6]
    for model in (fused, plain):
        add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", *wanted))
    answer_from_logits(plain, temperature=0.7)
    ids = torch.randint(0, fused.config.vocab_size, (2, 12))
    labels = ids.masked_fill(torch.arange(12) < 4, -100)  # a prompt of 4 tokens, not scored
    shifted = torch.cat([labels[:, 1:], torch.full((2, 1), -100)], dim=1)
    for extra in ({"labels": labels, "num_items_in_batch": 15}, {"shift_labels": shifted}):
        answers = [model(input_ids=ids, fused_lm_head=True, **extra) for model in (fused, plain)]
        for name in FIELDS:
            torch.testing.assert_close(
                getattr(answers[1], name), getattr(answers[0], name), rtol=1e-5, atol=1e-5
            )
        if family == "mixtral":
            assert answers[1].aux_loss is not None and answers[1].aux_loss.item() > 0
            torch.testing.assert_close(answers[1].aux_loss, answers[0].aux_loss)
    for model, answer in zip((fused, plain), answers, strict=True):
        model.zero_grad()
        answer.loss.backward()
    for (name, trained), (_, reference) in zip(
        plain.named_parameters(), fused.named_parameters(), strict=True
    ):
        torch.testing.assert_close(trained.grad, reference.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert torch.equal(plain(input_ids=ids).logits, fused(input_ids=ids).logits)  # unscored calls: as before


def pipeline(folder: Path, base: Path, **stages: dict) -> Path:
    path = write_pipeline(folder, "head", stages, precision="fp32", seed=0, workers=1)
    path.write_text(
        path.read_text().replace("base_model: tiny", f"base_model: {base}\nchat_template: chatml")
    )
    return path


def test_the_plan_reads_the_head_as_peft_will_wrap_it(tmp_path, bare, capsys):
    qwen2 = template_less(tmp_path / "qwen2-bare", build_family("qwen2", tmp_path / "built"))
    lora = {"r": 8}
    path = pipeline(
        tmp_path,
        bare,
        tied=stage("sft", lora=lora),
        dpo=stage("dpo", lora=lora),
        untied=stage("sft", lora=lora, model=str(qwen2)),
        full=stage("sft"),
        sharded=stage("sft", lora=lora, backend="fsdp", workers=2),
        reward=stage("reward", lora=lora),
    )
    heads = {name: stage.lm_head for name, stage in build(load(path), CPU).stages.items()}
    assert (heads["tied"].path, heads["tied"].template_rows) == (PLAIN, True)
    assert (heads["dpo"].path, heads["dpo"].template_rows) == (PLAIN, True)
    # the logits the plain path builds: 4 sequences (8 for 4 DPO pairs) x 64 tokens x the vocabulary
    vocab = AutoModelForCausalLM.from_pretrained(bare).config.vocab_size
    assert f"logits ({4 * 4 * 64 * vocab / 1e6:.2f} MB in fp32 per micro-batch" in heads["tied"].reason
    assert f"logits ({4 * 8 * 64 * vocab / 1e6:.2f} MB in fp32 per micro-batch" in heads["dpo"].reason
    assert (heads["untied"].path, heads["untied"].template_rows) == (PLAIN, True)
    assert "and in the untied LM head" in heads["untied"].reason
    assert (heads["full"].path, heads["full"].template_rows) == (FUSED, False)
    assert (heads["sharded"].path, heads["sharded"].template_rows) == (FUSED, False)
    assert "train them under zero2 or ddp" in heads["sharded"].reason
    assert heads["reward"] is None  # a sequence classifier: no LM head, no fused head
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count("lm head: plain (LoRA trains the template's 2 token rows (<|im_start|> <|im_end|>)") == 3
    assert out.count("lm head: fused (") == 2


def run_stage(path: Path, name: str, out: Path, adapters: tuple[str, ...] = ()) -> dict:
    """A stage of the pipeline file run by align's runner in this process, on the base plus `adapters`."""
    plan = build(load(path), CPU).stages[name]
    launch = launch_of(plan, StageInputs(ModelInput(plan.model_source, adapters)))
    return run_seeded(StageContext(plan=plan, output_dir=out, launch=launch)).metrics


@pytest.mark.integration
def test_a_tied_base_with_chatml_trains_sft_then_dpo_under_lora_and_chats_in_peft(tmp_path, bare):
    from peft import PeftModel

    lora = {"r": 8}
    sft = stage("sft", steps=4, lora=lora, trl={"learning_rate": 1e-2})
    path = pipeline(tmp_path, bare, sft=sft, dpo=stage("dpo", steps=3, lora=lora))
    sft_metrics = run_stage(path, "sft", tmp_path / "sft")
    adapter = tmp_path / "sft" / "adapter"
    dpo_metrics = run_stage(path, "dpo", tmp_path / "dpo", (str(adapter),))
    assert sft_metrics["trainable_changed"] == 1.0 and dpo_metrics["trainable_changed"] == 1.0
    assert sft_metrics["eval_loss_after"] < sft_metrics["eval_loss_before"]

    base = AutoModelForCausalLM.from_pretrained(bare)
    rows = base.get_input_embeddings().weight.detach().clone()
    for trained in (adapter, tmp_path / "dpo" / "adapter"):
        tokenizer = AutoTokenizer.from_pretrained(trained)
        ids = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
        assert tokenizer.chat_template == BUILTIN["chatml"].text and tokenizer.eos_token == "<|im_end|>"
        saved = load_file(trained / "adapter_model.safetensors")
        (delta,) = [tensor for key, tensor in saved.items() if "trainable_tokens_delta" in key]
        assert delta.shape == (2, rows.shape[1]) and not torch.allclose(delta, rows[ids])  # the rows trained
        model = AutoModelForCausalLM.from_pretrained(bare)
        model.resize_token_embeddings(len(tokenizer))
        model = PeftModel.from_pretrained(model, trained).eval()
        head = model.get_output_embeddings().weight  # tied: the head reads the trained rows
        torch.testing.assert_close(head[ids], delta)
        prompt = tokenizer.apply_chat_template(
            HI, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
        assert out.shape[1] > prompt["input_ids"].shape[1]


def end_of_turn_probability(model: torch.nn.Module, tokenizer, rows: list[list[dict]]) -> float:
    """The mean probability the model gives `<|im_end|>` right after each assistant answer of `rows`."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    found = []
    for messages in rows:
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        cut = len(ids) - 1 - ids[::-1].index(end)  # the last turn's end: predicted from what precedes it
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids[:cut]])).logits[0, -1]
        found.append(torch.softmax(logits.float(), -1)[end].item())
    return sum(found) / len(found)


@pytest.mark.integration
def test_an_untied_base_learns_to_end_a_turn_under_lora(tmp_path):
    """An untied head's row for a new `<|im_end|>` starts as the mean of the others: unless it trains with the
    embeddings' rows, the model never learns to stop (P 0.0012 after 40 steps, measured, against 0.21)."""
    from peft import PeftModel

    from align.data.corpora import builtin_path

    qwen2 = template_less(tmp_path / "qwen2-bare", build_family("qwen2", tmp_path / "built"))
    sft = stage("sft", steps=12, lora={"r": 8}, trl={"learning_rate": 1e-2})
    path = pipeline(tmp_path, qwen2, sft=sft)
    metrics = run_stage(path, "sft", tmp_path / "sft")
    adapter = tmp_path / "sft" / "adapter"
    saved = load_file(adapter / "adapter_model.safetensors")
    deltas = sorted(key for key in saved if "trainable_tokens_delta" in key)
    assert len(deltas) == 2 and any("lm_head" in key for key in deltas), deltas  # embeddings and head
    assert metrics["trainable_changed"] == 1.0

    rows = [
        json.loads(line)["messages"]
        for line in builtin_path("align:chatterbot/sft/test").read_text().splitlines()[:16]
    ]
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    base = AutoModelForCausalLM.from_pretrained(qwen2)
    base.resize_token_embeddings(len(tokenizer))
    before = end_of_turn_probability(base.eval(), tokenizer, rows)
    model = AutoModelForCausalLM.from_pretrained(qwen2)
    model.resize_token_embeddings(len(tokenizer))
    after = end_of_turn_probability(PeftModel.from_pretrained(model, adapter).eval(), tokenizer, rows)
    assert after > 10 * before, (before, after)
