"""What `align submit` packs as the job's folder: the pipeline file with its paths rewritten to the packed
copies, local files smallest first within the limit, the user's reward modules; model folders, larger
files and the output root stay where the cluster must see them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from align.pipeline.file import load, resolved
from align.run.package import build


def rows(path: Path, count: int, greeting: str = "Hi") -> Path:
    turns = [{"role": "user", "content": greeting}, {"role": "assistant", "content": "Hello!"}]
    path.write_text("".join(json.dumps({"messages": turns}) + "\n" for _ in range(count)))
    return path


def pipeline_file(folder: Path) -> Path:
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_text("{}")
    (folder / "model" / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (folder / "packed_rewards.py").write_text(
        "def short(completions, **_):\n    return [1.0 for _ in completions]\n"
    )
    rows(folder / "small.jsonl", 10)
    rows(folder / "large.jsonl", 2000, greeting="Bye")  # held out: rows the small file never trains on
    body = {
        "name": "packed",
        "base_model": "tiny",
        "allow_custom_code": True,
        "stages": {
            "sft": {"kind": "sft", "data": {"train": "small.jsonl", "eval": "large.jsonl"}},
            "grpo": {
                "kind": "grpo",
                "model": "${stages.sft.output}",
                "data": {"train": "align:toy/number-or-word/train"},
                "rewards": [{"function": "packed_rewards.short"}],
            },
        },
    }
    path = folder / "packed.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_small_files_travel_large_ones_and_outputs_stay(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = pipeline_file(tmp_path)
    small = (tmp_path / "small.jsonl").stat().st_size
    package = build(path, resolved(path, []), load(path), limit=small + 100)

    shipped = yaml.safe_load((package.folder / "packed.yaml").read_text())
    assert shipped["stages"]["sft"]["data"]["train"] == "files/0-small.jsonl"
    assert (package.folder / "files" / "0-small.jsonl").read_bytes() == (
        tmp_path / "small.jsonl"
    ).read_bytes()
    assert shipped["stages"]["sft"]["data"]["eval"] == str(tmp_path / "large.jsonl")  # over the limit
    assert (package.folder / "packed_rewards.py").is_file()
    shared = {where: why for where, _, why in package.shared}
    assert shared["stages.sft.data.eval"].endswith("over the pack limit")
    assert shared["defaults.output_root"] == "where the job writes"
    assert shipped["defaults"]["output_root"] == str(tmp_path / "runs")


def test_a_model_folder_never_travels(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = pipeline_file(tmp_path)
    raw = resolved(path, [f"base_model={tmp_path / 'model'}"])
    package = build(path, raw, load(path, [f"base_model={tmp_path / 'model'}"]))
    assert ("base_model", str(tmp_path / "model"), "a model folder") in package.shared
    assert not (package.folder / "files" / "model").exists()
