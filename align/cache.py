"""Where builtin models, data and check verdicts are cached, how a cache entry is built exactly once,
and what a path a user wrote means (`user_path`).

Kept free of torch so that `align validate` stays quick.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cache_root() -> Path:
    """`$ALIGN_CACHE` if set, else `~/.cache/align`: builtin models and data live here."""
    return Path(os.environ.get("ALIGN_CACHE") or Path.home() / ".cache" / "align")


def build_once(target: Path, builder: Callable[[Path], None]) -> Path:
    """Build `target` with `builder` unless it exists; safe when several ranks ask at the same time.

    The builder writes into a temporary sibling that is renamed into place, so `target` either
    does not exist or is complete. A file lock makes the other callers wait instead of building too.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_dir():  # whoever held the lock before us may have built it
            scratch = target.parent / f".{target.name}.building"
            shutil.rmtree(scratch, ignore_errors=True)  # left by a build that was killed
            scratch.mkdir()
            try:
                builder(scratch)
                os.rename(scratch, target)
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
    return target


def user_path(value: str, base: Path | None = None) -> Path:
    """The absolute path a user meant by `value`: `~` expanded where possible (an unknown `~user` stays a
    plain name), and a relative path taken from `base`, the folder it was written for (the working
    directory when None). `..` is collapsed as written, without following links, so messages show the
    path the user gave."""
    path = Path(value)
    try:
        path = path.expanduser()
    except RuntimeError:
        pass
    return Path(os.path.abspath(Path(base or os.getcwd()) / path))


def write_atomically(path: Path, text: str) -> None:
    """Write a cache entry so that readers see a whole file or none, even with several writers."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".{os.getpid()}.tmp")
    scratch.write_text(text, encoding="utf-8")
    os.replace(scratch, path)


def cached_json(folder: str, key: str, compute: Callable[[], Any]) -> Any:
    """`compute()`'s answer (JSON data), kept in align's cache as `folder/key.json` and read back while it is
    there; a cache that cannot be written only makes the next call compute again."""
    entry = cache_root() / folder / f"{key}.json"
    try:
        return json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    found = compute()
    try:
        write_atomically(entry, json.dumps(found, default=str))
    except OSError:
        pass
    return found


def is_dir(path: Path) -> bool:
    """`Path.is_dir` that answers False, not raises, for names the OS refuses (too long, bad bytes)."""
    return os.path.isdir(path)


def exists(path: Path) -> bool:
    """`Path.exists` that answers False, not raises, for names the OS refuses."""
    return os.path.exists(path)


def link_loop(path: Path) -> bool:
    """Whether `path` is a symbolic link that leads back to itself, which `exists` answers as missing: the
    user then looks for a file that is there, as a link."""
    try:
        os.stat(path)
    except OSError as err:
        return err.errno == errno.ELOOP
    except ValueError:  # a name with a NUL byte
        return False
    return False
