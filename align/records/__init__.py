"""Every record that crosses a package or a process, typed and versioned, written and read only here.
May import: errors. Nothing above it reads these files by key or writes them by hand."""

from align.records.eval import EVAL_RESULTS, EvalResults
from align.records.progress import LOGS, LoggedStep, Progress, read_progress, write_progress
from align.records.result import StageError, StageResult, read_error, read_result, write_error, write_result
from align.records.stage import Attempt, MemoryRow, Output, RankPlace, Resolved, StageRecord
from align.records.sweep import SweepState, VariantEnd
from align.records.versioned import Record, RecordFormatError, read, write
from align.records.worker import WorkerConfig

__all__ = [
    "Attempt",
    "EvalResults",
    "EVAL_RESULTS",
    "LOGS",
    "LoggedStep",
    "MemoryRow",
    "Output",
    "Progress",
    "RankPlace",
    "Record",
    "RecordFormatError",
    "Resolved",
    "StageError",
    "StageRecord",
    "StageResult",
    "SweepState",
    "VariantEnd",
    "WorkerConfig",
    "read",
    "read_error",
    "read_progress",
    "read_result",
    "write",
    "write_error",
    "write_progress",
    "write_result",
]
