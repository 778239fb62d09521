"""datasets' private code that align uses: a dataset's fingerprint, and the function that memory-maps an
Arrow file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from align.compat.versions import check_version

WRITTEN_FOR = ">=5.2,<5.3"
check_version("datasets", WRITTEN_FOR)


def dataset_fingerprint(dataset: Any) -> str:
    """The hash `datasets` keys its cache by: a transform given a new fingerprint derived from it is cached
    as a step after exactly this dataset."""
    return dataset._fingerprint


def arrow_file_opener() -> Callable[[str], Any] | None:
    """The function through which `datasets.table` memory-maps every Arrow file it opens (None where this
    `datasets` has none)."""
    from datasets import table

    return getattr(table, "_memory_mapped_arrow_table_from_file", None)


def replace_arrow_file_opener(opener: Callable[[str], Any]) -> None:
    """Make `opener` the one `datasets.table` opens Arrow files with, for the whole process: nothing public
    lets a caller act on a file as `datasets` maps it."""
    from datasets import table

    table._memory_mapped_arrow_table_from_file = opener
