"""Hub datasets, `hf:org/name[:config]@split[#revision]`: the ref parsed, its revision resolved to the commit
the hub serves (what a stage's fingerprint holds, so a re-pushed dataset reruns its stage), and its rows
read from `datasets`' cache whenever that commit was prepared there before.

Where no hub is reached (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set, or no answer within `HUB_TIMEOUT`
seconds, asked once) a ref resolves from the local caches alone: huggingface_hub's `refs/<revision>` file
names the commit a branch or tag last pointed at, and `datasets`' folder `org___name/<config>/<version>/
<commit>/` holds the rows a `load_dataset` of that commit prepared. Without either, a one-line DataError
says how to proceed. Nothing here imports `datasets` until rows are read, so `align validate` and
`align plan` stay quick and never need the network.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from align.cache import write_atomically
from align.errors import DataError

HUB_PREFIX = "hf:"
HUB_TIMEOUT = 10.0  # seconds for the one question asked of the hub: which commit a revision is now
HUB_FORM = "hf:org/name[:config]@split[#revision]"
COMMIT = re.compile(r"[0-9a-f]{40}")
REF = re.compile(
    r"hf:(?P<name>[\w.-]+(?:/[\w.-]+)?)(?::(?P<config>[^@#\s]+))?(?:@(?P<split>[^:@#\s]+))?(?:#(?P<revision>\S+))?"
)
TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class HubRef:
    """A parsed hub ref; `config` None is the dataset's default, `revision` None its main branch."""

    name: str
    config: str | None
    split: str
    revision: str | None

    def __str__(self) -> str:
        config = f":{self.config}" if self.config else ""
        return f"{HUB_PREFIX}{self.name}{config}@{self.split}" + (
            f"#{self.revision}" if self.revision else ""
        )

    @property
    def pinned(self) -> bool:
        """Whether the revision is a commit: nothing to ask the hub."""
        return self.revision is not None and COMMIT.fullmatch(self.revision) is not None


@dataclass(frozen=True)
class Prepared:
    """What `datasets` prepared of one commit of a hub dataset: its folder and `dataset_info.json`."""

    folder: Path
    info: dict[str, Any]

    @property
    def commit(self) -> str:
        return self.folder.name

    @property
    def config(self) -> str:
        return self.folder.parent.parent.name

    @property
    def splits(self) -> dict[str, int]:
        """Each split and its rows."""
        splits = self.info.get("splits") or {}
        return {name: int(split.get("num_examples") or 0) for name, split in splits.items()}

    @property
    def features(self) -> dict[str, Any]:
        return self.info.get("features") or {}


def parse_hub_ref(ref: str) -> HubRef:
    """The parts of `ref`; a DataError that shows the form for one that does not fit it."""
    match = REF.fullmatch(ref.strip())
    if match is None:
        raise DataError(f"{ref} is not a hub ref; write {HUB_FORM}, e.g. hf:trl-lib/tldr@train")
    return HubRef(match["name"], match["config"], match["split"] or "train", match["revision"])


def offline() -> bool:
    """Whether the hub may not be asked: HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) or HF_DATASETS_OFFLINE."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    return any(os.environ.get(name, "").upper() in TRUE for name in names)


def hf_home() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return Path(os.environ.get("HF_HOME") or default).expanduser()


def hub_cache() -> Path:
    """huggingface_hub's cache, read from the environment when asked (not when first imported)."""
    folder = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    return Path(folder).expanduser() if folder else hf_home() / "hub"


def datasets_home() -> Path:
    """`datasets`' own cache, where `load_dataset` of a hub dataset prepares its rows."""
    folder = os.environ.get("HF_DATASETS_CACHE")
    return Path(folder).expanduser() if folder else hf_home() / "datasets"


def refs_file(ref: HubRef) -> Path:
    """Where huggingface_hub notes the commit a dataset's branch or tag named when last asked."""
    return hub_cache() / f"datasets--{ref.name.replace('/', '--')}" / "refs" / (ref.revision or "main")


def cached_commit(ref: HubRef) -> str | None:
    """The commit the revision named when this machine last reached the hub (huggingface_hub's refs file)."""
    if ref.pinned:
        return ref.revision
    try:
        commit = refs_file(ref).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return commit if COMMIT.fullmatch(commit) else None


def prepared(ref: HubRef) -> list[Prepared]:
    """Every prepared commit of the ref's config (of any config, when the ref names none), newest first."""
    namespace, _, name = ref.name.rpartition("/")
    root = datasets_home() / (f"{namespace}___{snake_case(name)}" if namespace else snake_case(name))
    found = []
    for folder in root.glob(f"{ref.config or '*'}/*/*"):
        try:
            info = json.loads((folder / "dataset_info.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found.append((folder.stat().st_mtime, Prepared(folder, info)))
    return [entry for _, entry in sorted(found, key=lambda pair: pair[0], reverse=True)]


def snake_case(name: str) -> str:
    """`datasets`' folder name for a dataset name (its `camelcase_to_snakecase`)."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()


def local_copy(ref: HubRef) -> Prepared | None:
    """The prepared copy of the commit the ref's revision names (by its refs file); with no revision and no
    refs file, of the only commit prepared (as `load_dataset` offline takes it)."""
    copies, commit = prepared(ref), cached_commit(ref)
    if commit is not None:
        copies = [copy for copy in copies if copy.commit == commit]
    elif ref.revision is not None or len({copy.commit for copy in copies}) > 1:
        return None  # nothing says which commit the revision is
    if len({copy.config for copy in copies}) > 1:
        return None  # the ref must name its config
    return copies[0] if copies else None


def hub_commit(ref: HubRef) -> str | None:
    """The commit the hub serves for the ref's revision now; None where no hub answers in time."""
    if offline():
        return None
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    try:
        commit = HfApi().dataset_info(ref.name, revision=ref.revision, timeout=HUB_TIMEOUT).sha
    except RevisionNotFoundError:
        raise DataError(f"{ref}: the hub has no revision {ref.revision!r} of {ref.name}") from None
    except RepositoryNotFoundError:
        raise DataError(f"{ref}: the hub has no dataset {ref.name} (or it is gated: log in)") from None
    except Exception:  # noqa: BLE001 - no network, a timeout, a proxy's page: the hub is not reached
        return None
    if commit and not ref.pinned:
        try:  # as huggingface_hub notes it on a download: an offline run later resolves the same
            write_atomically(refs_file(ref), commit)
        except OSError:
            pass
    return commit


def resolved(ref: str) -> HubRef:
    """The ref pinned to a commit: the hub's answer, else the local caches'. A DataError where neither
    says which commit it is."""
    hub = parse_hub_ref(ref)
    if hub.pinned:
        return hub
    commit = hub_commit(hub)
    if commit is None:
        copy = local_copy(hub)
        commit = copy.commit if copy is not None else None
    if commit is None:
        raise DataError(unreached(hub))
    return replace(hub, revision=commit)


def unreached(ref: HubRef) -> str:
    """Why a ref cannot be read here, and how to proceed, in one line."""
    why = "the hub is off here (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE)" if offline() else "no hub answered"
    cached = sorted({f"{copy.config}#{copy.commit}" for copy in prepared(replace(ref, config=None))})
    if cached:
        how = f"name one of the commits cached here ({', '.join(cached)}) as {HUB_FORM}"
    else:
        how = "run it once where the hub is reachable, with this HF_HOME, and it reads the cached copy after"
    return f"{ref} is not in the local datasets cache ({datasets_home()}), and {why}: {how}"


def hub_rows(ref: str) -> Any:
    """The rows of a hub ref's split at its resolved commit: from `datasets`' cache when that commit was
    prepared, else loaded from the hub."""
    hub = resolved(ref)
    copy = next((copy for copy in prepared(hub) if copy.commit == hub.revision), None)
    if copy is not None:
        return cached_split(hub, copy)
    if hub_commit(hub) is None:
        raise DataError(unreached(hub))
    from datasets import load_dataset

    try:
        return load_dataset(
            hub.name, hub.config, split=hub.split, revision=hub.revision, cache_dir=str(datasets_home())
        )
    except Exception as error:  # noqa: BLE001 - an unknown config or split, a gated file: the user's to fix
        raise DataError(f"{hub} cannot be loaded from the hub: {str(error).splitlines()[0]}") from None


def cached_split(ref: HubRef, copy: Prepared) -> Any:
    """A split of a prepared commit, read by `datasets`' own cache builder with its folder named outright
    (`load_dataset` offline takes the newest prepared commit, whichever it is)."""
    if ref.split not in copy.splits:
        raise DataError(f"{ref} has no split {ref.split!r}; it has: {', '.join(copy.splits)}")
    from datasets.packaged_modules.cache.cache import Cache

    version = copy.folder.parent.name
    builder = Cache(
        cache_dir=str(datasets_home()),
        dataset_name=copy.folder.parents[2].name.rpartition("___")[2],
        repo_id=ref.name,
        config_name=copy.config,
        version=version,
        hash=copy.commit,
    )
    return builder.as_dataset(split=ref.split)
