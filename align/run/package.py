"""What `align submit` sends as the job's working directory, wherever it is run from: the pipeline file with
`--set` applied and every path resolved, the local data files it names (up to a size limit in all), and the
modules of the user's own reward functions. The rest must already be where the cluster's nodes see it:
model folders, larger data, and the output root, which the job writes under."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from align.config.spec import Pipeline
from align.config.stage_parts import rewards_of
from align.data.loading import split_ref

PACK_LIMIT = 100 * 10**6
"""Local files packed with a job, in bytes, by default; Ray caps a working directory at about 500 MB."""
FILES_FOLDER = "files"


@dataclass
class Package:
    folder: Path  # the job's working directory, the pipeline file at its top
    pipeline_file: str
    packed: list[tuple[str, int]] = field(default_factory=list)  # (file in the folder, bytes)
    shared: list[tuple[str, str, str]] = field(default_factory=list)  # (YAML path, path, why it stays)


def size_of(path: Path) -> int:
    return (
        sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        if path.is_dir()
        else path.stat().st_size
    )


def local_paths(value: Any, at: str = "") -> list[tuple[str, Any, Any, Path]]:
    """(YAML path, container, key, path) of every value that names a file or folder on this machine."""
    if isinstance(value, dict):
        items = [(f"{at}.{key}" if at else str(key), key, item) for key, item in value.items()]
    elif isinstance(value, list):
        items = [(f"{at}.{index}", index, item) for index, item in enumerate(value)]
    else:
        return []
    found = []
    for where, key, item in items:
        if isinstance(item, str) and item.startswith("/") and split_ref(item)[0].exists():
            found.append((where, value, key, split_ref(item)[0]))
        else:
            found += local_paths(item, where)
    return found


def is_model_folder(path: Path) -> bool:
    return (path / "config.json").is_file()


def reward_modules(pipeline: Pipeline) -> list[Path]:
    """The file or package folder of each user reward function's top module, found as the workers would
    import it (align's own `align.rewards` and installed packages travel with the cluster's environment)."""
    tops = {
        reward.function.split(".")[0]
        for stage in pipeline.stages.values()
        for reward in rewards_of(stage)
        if getattr(reward, "function", None) and "." in reward.function
    }
    sys.path[:0] = pipeline.module_roots()
    try:
        specs = [importlib.util.find_spec(top) for top in sorted(tops - {"align"})]
    finally:
        del sys.path[: len(pipeline.module_roots())]
    roots = [Path(root) for root in pipeline.module_roots()]
    origins = [Path(spec.origin) for spec in specs if spec and spec.origin]
    found = [origin.parent if origin.name == "__init__.py" else origin for origin in origins]
    return [path for path in found if any(path.is_relative_to(root) for root in roots)]


def build(pipeline_file: Path, raw: dict[str, Any], pipeline: Pipeline, limit: int = PACK_LIMIT) -> Package:
    """The job's folder: the files the pipeline names (data, configs, templates) copied in, smallest first
    while they fit `limit` in all, and named relatively there; model folders, the output root and what does
    not fit stay at their absolute paths, listed in `shared` with why."""
    package = Package(Path(tempfile.mkdtemp(prefix="align-job-")), pipeline_file.name)
    budget = limit
    named = [item for item in local_paths(raw) if item[0] != "defaults.output_root"]
    for where, container, key, path in sorted(named, key=lambda item: size_of(item[3])):
        size = size_of(path)
        over = f"{size / 1e6:.1f} MB, over the pack limit" if size > budget else None
        if reason := "a model folder" if is_model_folder(path) else over:
            package.shared.append((where, str(path), reason))
            continue
        budget -= size
        copy = Path(FILES_FOLDER) / f"{len(package.packed)}-{path.name}"
        (package.folder / FILES_FOLDER).mkdir(exist_ok=True)
        (shutil.copytree if path.is_dir() else shutil.copy)(path, package.folder / copy)
        container[key] = container[key].replace(str(path), str(copy), 1)
        package.packed.append((str(copy), size))
    for module in reward_modules(pipeline):
        (shutil.copytree if module.is_dir() else shutil.copy)(module, package.folder / module.name)
        package.packed.append((module.name, size_of(module)))
    package.shared.append(("defaults.output_root", pipeline.defaults.output_root, "where the job writes"))
    (package.folder / package.pipeline_file).write_text(yaml.safe_dump(raw, sort_keys=False))
    return package
