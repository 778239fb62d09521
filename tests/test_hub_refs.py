"""Hub refs `hf:org/name[:config]@split[#revision]` with no network: a `datasets` cache laid out as
`load_dataset` leaves it (`org___name/<config>/<version>/<commit>/`, found by `load_dataset` offline too) and
huggingface_hub's `refs/<revision>` files stand in for the hub. A revision resolves to its commit, the rows
are that commit's, the fingerprint follows the commit, and an uncached ref fails in one line."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from align.data.hub import parse_hub_ref
from align.data.loading import data_identity, load_data
from align.data.scan import check_data
from align.errors import DataError
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.launch import launch_of
from align.planning.plan import build
from align.run.inputs import fingerprint, pinned, resolve_inputs
from pipelines import QUIET_TRL, write_pipeline

OLD, NEW = "a" * 40, "b" * 40
CPU = Hardware(accelerator=False, device_memory=80 * 10**9)


def prepare(home: Path, commit: str, rows: list[dict], config: str = "chat") -> None:
    """What `load_dataset("org/tiny_chat", config, revision=commit)` leaves in `datasets`' cache: the json
    builder's Arrow files and dataset_info.json under org___tiny_chat/<config>/0.0.0/<commit>/."""
    from datasets.packaged_modules.json.json import Json

    home.mkdir(exist_ok=True)
    source = home / f"{commit[:4]}.jsonl"
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    built = home / "built"
    Json(
        cache_dir=str(built),
        dataset_name="tiny_chat",
        config_name=config,
        config_id=config,
        hash=commit,
        data_files={"train": str(source), "test": str(source)},
    ).download_and_prepare()
    target = home / "datasets" / "org___tiny_chat" / config / "0.0.0"
    target.mkdir(parents=True, exist_ok=True)
    shutil.move(built / "tiny_chat" / config / "0.0.0" / commit, target / commit)


def point(home: Path, revision: str, commit: str) -> None:
    """huggingface_hub's record of the commit a branch or tag named when the hub was last reached."""
    refs = home / "hub" / "datasets--org--tiny_chat" / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / revision).write_text(commit)


@pytest.fixture
def hub_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An HF_HOME holding two commits of org/tiny_chat (config `chat`): main at OLD, the tag v2 at NEW."""
    home = tmp_path / "hf"
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    prepare(home, OLD, [{"prompt": f"old {i}", "completion": "x"} for i in range(3)])
    prepare(home, NEW, [{"prompt": f"new {i}", "completion": "y"} for i in range(5)])
    point(home, "main", OLD)
    point(home, "v2", NEW)
    return home


def test_a_ref_with_a_config_and_a_revision_loads_that_commits_rows_offline(hub_home: Path) -> None:
    by_tag = load_data("hf:org/tiny_chat:chat@train#v2", "sft", "stages.sft.data.train")
    assert by_tag["prompt"] == [f"new {i}" for i in range(5)]
    by_commit = load_data(f"hf:org/tiny_chat:chat@test#{OLD}", "sft", "stages.sft.data.train")
    assert by_commit["prompt"] == [f"old {i}" for i in range(3)]
    assert len(load_data("hf:org/tiny_chat:chat@train", "sft", "d")) == 3  # no revision: main, at OLD


def test_the_fingerprint_is_the_commit_the_revision_resolves_to(hub_home: Path) -> None:
    main = data_identity("hf:org/tiny_chat:chat@train", "d")
    assert main == f"hf:org/tiny_chat:chat@train#{OLD}"
    assert data_identity("hf:org/tiny_chat:chat@train#v2", "d") == f"hf:org/tiny_chat:chat@train#{NEW}"
    point(hub_home, "main", NEW)  # the dataset was pushed again, and this machine saw it
    assert data_identity("hf:org/tiny_chat:chat@train", "d") != main


def test_a_repushed_dataset_reruns_its_stage_and_the_record_names_the_commit(
    hub_home: Path, tmp_path: Path
) -> None:
    sft = {"kind": "sft", "data": {"train": "hf:org/tiny_chat:chat@train", "eval": "none"}, "trl": QUIET_TRL}
    plan = build(load(write_pipeline(tmp_path, "hub", {"sft": sft})), CPU).stages["sft"]

    def stamp() -> tuple[str, str]:
        stage = pinned(launch_of(plan, resolve_inputs(plan, {})))
        return stage.stage.data.train, fingerprint(stage, {})

    ref, first = stamp()
    assert ref == f"hf:org/tiny_chat:chat@train#{OLD}"  # what the worker loads and the record's config holds
    assert stamp() == (ref, first)
    point(hub_home, "main", NEW)
    assert stamp()[0].endswith(NEW) and stamp()[1] != first


def test_an_uncached_ref_fails_in_one_line_that_says_how_to_proceed(hub_home: Path) -> None:
    with pytest.raises(DataError) as raised:
        load_data("hf:org/elsewhere@train", "sft", "stages.sft.data.train")
    message = str(raised.value)
    assert message.startswith(
        "stages.sft.data.train: hf:org/elsewhere@train is not in the local datasets cache"
    )
    assert (
        "HF_HUB_OFFLINE" in message and "run it once where the hub is reachable, with this HF_HOME" in message
    )
    assert "\n" not in message


def test_an_unreachable_hub_falls_back_to_the_cache_at_once(
    hub_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not offline by the environment, but nothing answers: the cache decides, within a second."""
    import huggingface_hub.constants as hub_constants

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub_constants, "ENDPOINT", "http://127.0.0.1:9")  # a closed port: no hub here
    started = time.monotonic()
    assert data_identity("hf:org/tiny_chat:chat@train#v2", "d").endswith(NEW)
    assert time.monotonic() - started < 5
    with pytest.raises(DataError, match="no hub answered"):
        data_identity("hf:org/elsewhere@train", "d")


def test_a_revision_the_hub_resolved_once_resolves_the_same_offline(
    hub_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub (stood in for by its answer) says v3 is commit NEW; offline afterwards, v3 is still NEW."""
    from huggingface_hub import HfApi

    asked = []

    def dataset_info(api: HfApi, name: str, revision: str | None, timeout: float) -> SimpleNamespace:
        asked.append((name, revision, timeout))
        return SimpleNamespace(sha=NEW)

    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(HfApi, "dataset_info", dataset_info)
    assert load_data("hf:org/tiny_chat:chat@train#v3", "sft", "d")["prompt"][0] == "new 0"  # from the cache
    assert asked and asked[0][:2] == ("org/tiny_chat", "v3") and asked[0][2] <= 10
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert data_identity("hf:org/tiny_chat:chat@train#v3", "d").endswith(NEW)
    with pytest.raises(DataError, match=f"name one of the commits cached here \\(chat#{OLD}, chat#{NEW}\\)"):
        data_identity("hf:org/tiny_chat:chat@train#v4", "d")  # never resolved here: no guess


def test_validate_reads_a_cached_copy_and_needs_no_hub(hub_home: Path) -> None:
    assert check_data("hf:org/tiny_chat:chat@train#v2", "sft", "d") is None
    assert "lacks columns 'chosen', 'rejected'" in check_data(
        "hf:org/tiny_chat:chat@train", "preferences", "d"
    )
    assert check_data("hf:org/tiny_chat:chat@dev", "sft", "d") == (
        "hf:org/tiny_chat:chat@dev has no split 'dev' in its cached copy; it has: train, test"
    )
    assert check_data("hf:org/elsewhere@train", "sft", "d") is None  # not here: absent_hub_data names it
    assert check_data("hf:org/a/b@train", "sft", "d").startswith(
        "hf:org/a/b@train is not a hub ref; write hf:"
    )


def test_refs_parse_into_name_config_split_and_revision() -> None:
    ref = parse_hub_ref("hf:HuggingFaceH4/ultrachat_200k:default@train_sft#v1.0")
    assert (ref.name, ref.config, ref.split, ref.revision) == (
        "HuggingFaceH4/ultrachat_200k",
        "default",
        "train_sft",
        "v1.0",
    )
    assert str(parse_hub_ref("hf:trl-lib/tldr")) == "hf:trl-lib/tldr@train"
