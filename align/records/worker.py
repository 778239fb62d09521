"""What the driver sends each rank of a stage (through Ray, not a file): the stage's launch (its plan and
what the driver added), where to write, the checkpoint to resume from, the clients of its frozen models in
actors, and whether to stream output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from align.records.versioned import RecordFormatError

WORKER_FORMAT = 2  # 2: the plan travels inside its launch (planning.Launch), no longer with its inputs


@dataclass(frozen=True)
class WorkerConfig:
    launch: Any  # the stage's planning.Launch, its plan inside (records sits below planning)
    output_dir: str
    resume: str | None = None
    services: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False
    format: int = WORKER_FORMAT

    def checked(self) -> WorkerConfig:
        """This config, once the rank knows it was written for its own format (a worker on a cluster runs
        the code the driver shipped, so a mismatch means a stale worker)."""
        if self.format != WORKER_FORMAT:
            raise RecordFormatError(
                f"WorkerConfig format {self.format}, but this worker reads format {WORKER_FORMAT}: "
                "the cluster runs another align than the driver"
            )
        return self
