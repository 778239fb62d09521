"""`chat_template:` for a base model that ships none: a builtin (chatml, llama3), a .jinja file, or a model
folder to take one from; resolved before anything loads, applied to the stage's tokenizer with its special
tokens (the embeddings resized to them, their rows trained under LoRA too), and saved with the output, which
then chats in plain transformers. The base here is what Llama-3-8B or Qwen2.5-7B base is to a user: no
template, no ChatML tokens in its vocabulary, no pad token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from align.cli import main
from align.models.chat_templates import BUILTIN, apply, fit_model, resolve_template
from align.models.tiny import english_text
from tests.pipelines import run, stage_folder, stage_record, write_pipeline

EOT = "<|endoftext|>"
TURN = "<|turn|>"
DONOR_TEMPLATE = (
    "{% for m in messages %}{{ '<|turn|>' + m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
)
HI = [{"role": "user", "content": "Hi"}]
CHATML_HI = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A random-init qwen2 with its own BPE tokenizer: one special token (EOS), no pad, no template."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=800, special_tokens=[EOT], initial_alphabet=alphabet, show_progress=False
    )
    bpe.train_from_iterator(english_text(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOT, model_max_length=2048)
    shape = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    config = AutoConfig.for_model(
        "qwen2",
        **shape,
        intermediate_size=128,
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("models") / "qwen2-base"
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert (
        tokenizer.chat_template is None
        and tokenizer.pad_token is None
        and "<|im_start|>" not in tokenizer.vocab
    )
    return folder


def donor(folder: Path) -> Path:
    """A folder holding only a tokenizer config: its template writes a special token the base lacks."""
    folder.mkdir()
    token = {"content": TURN, "special": True, "lstrip": False, "rstrip": False, "normalized": False}
    settings = {"chat_template": DONOR_TEMPLATE, "added_tokens_decoder": {"5000": token}, "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def chat_rows(path: Path, count: int = 48) -> Path:
    turns = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]
    path.write_text("".join(json.dumps({"messages": turns}) + "\n" for _ in range(count)))
    return path


def preference_rows(path: Path, count: int = 48) -> Path:
    row = {
        "prompt": [{"role": "user", "content": "Say hi."}],
        "chosen": [{"role": "assistant", "content": "Hi!"}],
        "rejected": [{"role": "assistant", "content": "No."}],
    }
    path.write_text("".join(json.dumps(row) + "\n" for _ in range(count)))
    return path


def with_base(path: Path, base: Path, template: str | None = "chatml") -> Path:
    """The pipeline file at `path` on `base`, with a top-level `chat_template:` when given."""
    line = f"base_model: {base}" + (f"\nchat_template: {template}" if template else "")
    path.write_text(path.read_text().replace("base_model: tiny", line))
    return path


def test_a_template_comes_from_a_name_a_file_or_a_model_folder(tmp_path: Path) -> None:
    assert resolve_template("chatml") is BUILTIN["chatml"]
    assert (BUILTIN["chatml"].eos, BUILTIN["llama3"].eos) == ("<|im_end|>", "<|eot_id|>")
    (tmp_path / "plain.jinja").write_text("{{ messages[0]['content'] }}")
    plain = resolve_template(str(tmp_path / "plain.jinja"))
    assert (plain.text, plain.special_tokens, plain.eos) == ("{{ messages[0]['content'] }}", (), None)
    (tmp_path / "chatml.jinja").write_text(BUILTIN["chatml"].text)  # a file's tokens and EOS are found in it
    own = resolve_template(str(tmp_path / "chatml.jinja"))
    assert (own.special_tokens, own.eos) == (("<|im_start|>", "<|im_end|>"), "<|im_end|>")
    taken = resolve_template(str(donor(tmp_path / "donor")))
    assert (taken.text, taken.special_tokens, taken.eos) == (DONOR_TEMPLATE, (TURN,), None)
    named = tmp_path / "named"
    named.mkdir()  # a processor-style chat_template.json holding named templates: the default is taken
    templates = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": DONOR_TEMPLATE}]
    (named / "chat_template.json").write_text(json.dumps({"chat_template": templates}))
    assert resolve_template(str(named)).text == DONOR_TEMPLATE
    with pytest.raises(
        ValueError, match="not a builtin chat template \\(chatml, llama3, chatml-tools\\), a .jinja file"
    ):
        resolve_template("vicuna")
    with pytest.raises(ValueError, match=f"there is no file or folder {tmp_path}/none.jinja"):
        resolve_template(str(tmp_path / "none.jinja"))
    with pytest.raises(ValueError, match="there is no file or folder /m+: give a builtin"):
        resolve_template("/" + "m" * 400)  # a name the OS refuses (too long) is named, not raised
    (tmp_path / "broken.jinja").write_text("{% for m in messages %}{{ m['content'] }}")
    with pytest.raises(ValueError, match="broken.jinja does not parse: Unexpected end of template.*line 1"):
        resolve_template(str(tmp_path / "broken.jinja"))
    with pytest.raises(ValueError, match="has no chat template to take"):
        resolve_template(str(tmp_path))


def test_applied_it_adds_its_tokens_resizes_the_model_and_saves_what_plain_transformers_loads(base, tmp_path):
    tokenizer, model = AutoTokenizer.from_pretrained(base), AutoModelForCausalLM.from_pretrained(base)
    size, end_of_text = len(tokenizer), tokenizer.eos_token_id
    tokenizer.pad_token = tokenizer.eos_token  # what load_tokenizer gives a model without a pad token
    fit_model(model, apply(BUILTIN["chatml"], tokenizer), BUILTIN["chatml"])
    assert len(tokenizer) == size + 2 and model.get_input_embeddings().num_embeddings == size + 2
    model.save_pretrained(tmp_path / "out")
    tokenizer.save_pretrained(tmp_path / "out")

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    im_start, im_end = tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert (im_start, im_end) == (size, size + 1)
    assert tokenizer.apply_chat_template(HI, tokenize=False, add_generation_prompt=True) == CHATML_HI
    ids = tokenizer.apply_chat_template(HI, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids[0] == im_start and ids.count(im_start) == 2 and ids.count(im_end) == 1
    assert (tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_end|>",
        EOT,
    )  # padding never hides a turn's end
    assert (model.config.eos_token_id, model.config.pad_token_id) == (im_end, end_of_text)
    assert model.generation_config.eos_token_id == [im_end, end_of_text]  # generate stops at a turn's end
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)

    taken = resolve_template(str(donor(tmp_path / "donor")))  # a model folder's token, added the same way
    assert TURN not in tokenizer.get_vocab()
    apply(taken, tokenizer)
    assert tokenizer(TURN, add_special_tokens=False)["input_ids"] == [len(tokenizer) - 1]
    assert tokenizer.eos_token == "<|im_end|>"  # the donor's EOS is not in its template: the EOS stays


def test_validate_refuses_conversations_for_a_base_without_a_template_and_names_the_setting(
    base, tmp_path, capsys
):
    chat, pairs = chat_rows(tmp_path / "chat.jsonl", 2), preference_rows(tmp_path / "pairs.jsonl", 2)
    stages = {
        "sft": {"kind": "sft", "data": {"train": str(chat)}},
        "dpo": {"kind": "dpo", "model": "${stages.sft.output}", "data": {"train": str(pairs)}},
    }
    path = with_base(write_pipeline(tmp_path, "bare", stages), base, template=None)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    for name in ("sft", "dpo"):
        assert (
            f"stages.{name}.data.train: its rows are conversations, but the model {base} has no chat "
            "template to render them (none in its tokenizer files): set `chat_template: chatml`"
        ) in err
    path = with_base(write_pipeline(tmp_path, "templated", stages), base)
    assert main(["validate", str(path)]) == 0


def test_a_relative_template_file_is_read_beside_the_pipeline_and_plan_says_what_each_stage_uses(
    base, tmp_path, capsys
):
    (tmp_path / "templates").mkdir()
    (tmp_path / "templates" / "mine.jinja").write_text(BUILTIN["llama3"].text)
    chat = chat_rows(tmp_path / "chat.jsonl", 2)
    stages = {
        "sft": {"kind": "sft", "data": {"train": str(chat)}},
        "own": {"kind": "sft", "data": {"train": str(chat)}, "chat_template": "templates/mine.jinja"},
        "missing": {"kind": "sft", "data": {"train": str(chat)}, "chat_template": "templates/none.jinja"},
    }
    path = with_base(write_pipeline(tmp_path, "mixed", stages), base)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"stages.missing.chat_template: there is no file or folder {tmp_path}/templates/none.jinja" in err
    del stages["missing"]
    path = with_base(write_pipeline(tmp_path, "mixed", stages), base)
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    chatml = "chat template: chatml (builtin); adds <|im_start|> <|im_end|> if missing; eos <|im_end|>"
    mine = f"chat template: {tmp_path}/templates/mine.jinja; adds <|start_header_id|> <|end_header_id|>"
    pad = f"pad token: {EOT}, the model's EOS (it has no pad token; padded positions carry no loss)"
    assert out.count(chatml) == 1 and out.count(mine) == 1 and out.count(pad) == 2


@pytest.mark.integration
def test_a_base_without_a_template_trains_with_chatml_and_its_outputs_chat_in_plain_transformers(
    base, tmp_path
):
    from peft import AutoPeftModelForCausalLM

    chat, pairs = chat_rows(tmp_path / "chat.jsonl"), preference_rows(tmp_path / "pairs.jsonl")
    quiet = {"max_steps": 2, "per_device_train_batch_size": 4, "report_to": []}
    lora = {"r": 4}
    stages = {
        "sft": {"kind": "sft", "data": {"train": str(chat)}, "trl": quiet},
        "sft_lora": {
            "kind": "sft",
            "data": {"train": str(chat)},
            "lora": lora,
            "trl": {**quiet, "learning_rate": 1e-2},
        },
        "dpo": {
            "kind": "dpo",
            "model": "${stages.sft_lora.output}",
            "data": {"train": str(pairs)},
            "lora": lora,
            "trl": quiet,
        },
        "merge": {"kind": "merge", "model": "${stages.dpo.output}"},
    }
    path = with_base(write_pipeline(tmp_path, "templated", stages, seed=0, precision="fp32"), base)
    run(path)
    size = len(AutoTokenizer.from_pretrained(base))

    for folder in (
        stage_folder(path, name) / output for name, output in (("sft", "model"), ("merge", "model"))
    ):
        tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
        im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        assert len(tokenizer) == size + 2 and model.get_input_embeddings().num_embeddings == size + 2
        assert tokenizer.apply_chat_template(HI, tokenize=False, add_generation_prompt=True) == CHATML_HI
        assert tokenizer("<|im_start|>user", add_special_tokens=False)["input_ids"][0] == size
        assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", EOT)
        assert model.config.eos_token_id == im_end and model.generation_config.eos_token_id[0] == im_end

    for name in (
        "sft_lora",
        "dpo",
    ):  # each adapter loads in plain peft, which resizes its base to the tokenizer
        adapter = stage_folder(path, name) / "adapter"
        tokenizer = AutoTokenizer.from_pretrained(adapter)
        assert tokenizer.apply_chat_template(HI, tokenize=False, add_generation_prompt=True) == CHATML_HI
        loaded = AutoPeftModelForCausalLM.from_pretrained(adapter).merge_and_unload()
        assert loaded.get_input_embeddings().num_embeddings == size + 2
        saved = load_file(adapter / "adapter_model.safetensors")
        deltas = {key: tensor for key, tensor in saved.items() if "trainable_tokens_delta" in key}
        # the two new tokens' rows trained in the input embeddings and in qwen2's untied LM head
        assert len(deltas) == 2 and any("lm_head" in key for key in deltas), list(deltas)
        assert all(delta.shape[0] == 2 and float(delta.abs().max()) > 0 for delta in deltas.values())
    assert stage_record(path, "merge")["metrics"]["merge_max_abs_logit_delta"] <= 1e-4


def test_every_builtin_template_marks_assistant_turns_as_trl_reads_them() -> None:
    """`align plan` reads the markers without TRL; its test and TRL's `has_generation_markers` agree."""
    from trl.chat_template_utils import has_generation_markers

    from align.models.chat_templates import BUILTIN, marks_assistant_turns

    assert all(marks_assistant_turns(template.text) for template in BUILTIN.values())
    for text in ("{% generation %}", "{%- generation -%}", "{%generation%}", "{{ generation }}", "plain"):
        assert marks_assistant_turns(text) == has_generation_markers(text)
