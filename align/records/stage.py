"""A stage folder's record (`align-stage.json`): what produced the folder, how each attempt went, and, once
it succeeded, what the next stage reads. The controller writes it as the stage starts ("running"), and again
as it ends; `status`, `report`, the skip logic and the next stage's inputs read it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from align.records.versioned import Record

STAGE_RECORD = "align-stage.json"

Metrics = dict[str, float | str]
"""A stage's figures by name, and the few lines it said for the record (`no_signal`: an RL stage whose
rewards never varied)."""

Status = Literal["running", "succeeded", "failed", "interrupted"]


class Part(BaseModel):
    """A part of a record: frozen, and tolerant of keys an older align wrote."""

    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")


class Resolved(Part):
    """What the plan decided for the stage, beside the config the user wrote."""

    backend: str
    backend_reason: str = ""
    workers: int
    precision: str
    trainable_dtype: str | None = None
    seed: int
    model: str
    adapters: list[str] = []


class MemoryRow(Part):
    """One row of the plan's per-rank bytes (`align plan`), set beside the measured peaks by `report`."""

    what: str
    device: int
    host: int


class RankPlace(Part):
    """Where one rank ran."""

    model_config = ConfigDict(frozen=True, extra="allow")  # a backend may add what it knows of the rank
    rank: int
    node_ip: str | None = None
    node_id: str | None = None
    local_rank: int | None = None
    gpus: list[Any] = []
    cpus: float | None = None


class Output(Part):
    """What the next stage reads: a base with its chain of adapters, or a whole model folder (an eval
    stage's output is its folder of results)."""

    kind: Literal["adapter", "model"]
    path: str
    base: str
    adapters: list[str] = []


class Attempt(Part):
    """One launch of the stage: where it started from, and why it ended early, if it did."""

    started: float
    resumed_from: int | None = None
    error: str | None = None


class StageRecord(Record):
    pipeline: str
    stage: str
    kind: str
    fingerprint: str
    config: dict[str, Any]
    resolved: Resolved
    memory_plan: list[MemoryRow] | None = None
    versions: dict[str, str | None] = {}
    git_sha: str | None = None
    started: float
    status: Status = "running"
    ended: float | None = None
    error: str | None = None
    metrics: Metrics = {}
    samples: list[dict[str, Any]] = []
    ranks: list[RankPlace] = []
    output: Output | None = None
    resumed_from: int | None = None
    steps_trained: int | None = None
    waited_s: float = 0.0
    retries: int = 0
    attempts: list[Attempt] = []

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    def ended_as(self, status: Status, **fields: Any) -> StageRecord:
        """This record as the stage ended: `status`, the end time and whatever else the end knows."""
        return self.model_copy(update={"status": status, **fields})
