"""`chat_template:` for a base model that ships none: a builtin (chatml), a .jinja file, or a model folder to
take one from; resolved before anything loads, applied to the stage's tokenizer with its special tokens
(the embeddings resized to them), and saved with the output, which then chats in plain transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from align.cli import main
from align.models.chat_templates import BUILTIN, resolve_template
from tests.families import build_family
from tests.pipelines import run, stage_folder, stage_record, write_pipeline

TURN = "<|turn|>"
DONOR_TEMPLATE = (
    "{% for m in messages %}{{ '<|turn|>' + m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
)


def without_template(folder: Path) -> Path:
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    return folder


def donor(folder: Path) -> Path:
    """A folder holding only a tokenizer config: its template writes a special token the base lacks."""
    folder.mkdir()
    token = {"content": TURN, "special": True, "lstrip": False, "rstrip": False, "normalized": False}
    settings = {"chat_template": DONOR_TEMPLATE, "added_tokens_decoder": {"5000": token}, "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def chat_rows(path: Path, count: int = 64) -> Path:
    turns = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]
    path.write_text("".join(json.dumps({"messages": turns}) + "\n" for _ in range(count)))
    return path


def test_a_template_comes_from_a_name_a_file_or_a_model_folder(tmp_path: Path) -> None:
    assert resolve_template("chatml") is BUILTIN["chatml"]
    assert BUILTIN["chatml"].eos == "<|im_end|>"
    (tmp_path / "mine.jinja").write_text("{{ messages[0]['content'] }}")
    assert resolve_template(str(tmp_path / "mine.jinja")).text == "{{ messages[0]['content'] }}"
    taken = resolve_template(str(donor(tmp_path / "donor")))
    assert (taken.text, taken.special_tokens, taken.eos) == (DONOR_TEMPLATE, (TURN,), None)
    with pytest.raises(
        ValueError, match="not a builtin chat template \\(chatml\\), a .jinja file or a model"
    ):
        resolve_template("vicuna")


def test_a_bad_template_is_named_by_validate(tmp_path: Path, capsys) -> None:
    rows = chat_rows(tmp_path / "chat.jsonl")
    sft = {"kind": "sft", "data": {"train": str(rows)}, "chat_template": "vicuna"}
    assert main(["validate", str(write_pipeline(tmp_path, "bad", {"sft": sft}))]) == 2
    assert "stages.sft.chat_template: 'vicuna' is not a builtin chat template" in capsys.readouterr().err


@pytest.mark.integration
def test_a_base_without_a_template_trains_with_one_and_its_outputs_chat_in_plain_transformers(tmp_path: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = without_template(build_family("qwen2", tmp_path / "models"))
    rows = chat_rows(tmp_path / "chat.jsonl")
    quiet = {"max_steps": 2, "per_device_train_batch_size": 4, "report_to": []}
    stages = {
        "sft": {"kind": "sft", "data": {"train": str(rows)}, "trl": quiet},
        "lora": {
            "kind": "sft",
            "data": {"train": str(rows)},
            "lora": {"r": 4},
            "trl": quiet,
            "chat_template": str(donor(tmp_path / "donor")),
        },
        "merge": {
            "kind": "merge",
            "model": "${stages.lora.output}",
            "chat_template": str(tmp_path / "donor"),
        },
    }
    path = write_pipeline(tmp_path, "templated", stages, seed=0, precision="fp32")
    body = path.read_text().replace("base_model: tiny", f"base_model: {base}\nchat_template: chatml")
    path.write_text(body)
    run(path)

    full = stage_folder(path, "sft") / "model"
    tokenizer = AutoTokenizer.from_pretrained(full)
    assert AutoModelForCausalLM.from_pretrained(full).get_input_embeddings().num_embeddings >= len(tokenizer)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert text == "<|im_start|>user\nHi<|im_end|>\n" and tokenizer.eos_token == "<|im_end|>"
    assert len(tokenizer("<|im_start|>", add_special_tokens=False)["input_ids"]) == 1

    adapter = stage_folder(path, "lora") / "adapter"
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    assert tokenizer(TURN, add_special_tokens=False)["input_ids"] == [tokenizer.convert_tokens_to_ids(TURN)]
    grown = AutoModelForCausalLM.from_pretrained(base)
    assert grown.get_input_embeddings().num_embeddings < len(tokenizer)  # the token was added: rows too
    grown.resize_token_embeddings(len(tokenizer))
    PeftModel.from_pretrained(grown, adapter)  # the adapter's resized embeddings load on the resized base
    merged = AutoModelForCausalLM.from_pretrained(stage_folder(path, "merge") / "model")
    assert merged.get_input_embeddings().num_embeddings == len(tokenizer)
    assert stage_record(path, "merge")["metrics"]["merge_max_abs_logit_delta"] <= 1e-4
