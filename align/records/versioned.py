"""The one way a record reaches a file and comes back: a frozen pydantic model that carries its format
version, written whole (a temporary file renamed into place, so a full disk leaves the old file or none),
read back through the same model. A file of a newer format than this align knows is refused with one line
naming its version; one of an older format is read (a file that predates format numbers is format 1)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict

from align.errors import AlignError


class RecordFormatError(AlignError):
    """A record written by a newer align than this one."""


class Record(BaseModel):
    """A record: frozen, tolerant of keys an older align wrote that this one no longer keeps, and writing a
    NaN loss as JSON's NaN (as `json.dumps` does) rather than null, so that it reads back."""

    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")
    FORMAT: ClassVar[int] = 1
    format: int = 1

    @classmethod
    def parse(cls: type[R], data: dict[str, Any], source: str) -> R:
        """`data` as this record, from any format up to the current one."""
        found = data.get("format", 1)
        if not isinstance(found, int) or found > cls.FORMAT:
            raise RecordFormatError(
                f"{source}: {cls.__name__} format {found}, newer than this align reads (up to {cls.FORMAT}); "
                "upgrade align to read it"
            )
        return cls.model_validate({**data, "format": cls.FORMAT})

    def to_json(self) -> str:
        return self.model_dump_json(indent=2) + "\n"


R = TypeVar("R", bound=Record)


def write(path: Path, record: Record, sync: bool = True) -> None:
    """Write `record` to `path` whole or not at all (`sync`: on disk before it replaces the old file)."""
    scratch = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}"
    try:
        with open(scratch, "w") as out:
            out.write(record.to_json())
            if sync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def read(path: Path, kind: type[R]) -> R | None:
    """The record at `path`, or None where there is none or it is torn (a writer killed mid-write leaves
    the old file, so a torn one is a hand edit). A newer format raises RecordFormatError."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        return kind.parse(data, str(path))
    except RecordFormatError:
        raise
    except ValueError:  # pydantic's ValidationError: not a record of this kind
        return None
