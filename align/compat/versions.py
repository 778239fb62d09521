"""The version check each compat module runs as it is imported: a private API is trusted only on the
versions it was read in. Reading a distribution's version does not import it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from align.errors import AlignError


class UnsupportedVersion(AlignError):
    """An installed library outside the range a compat module was written for."""


def refusal(library: str, installed: str, written_for: str) -> str | None:
    """Why `installed` of `library` is refused by a module written for `written_for`; None within it."""
    if SpecifierSet(written_for).contains(Version(installed), prereleases=True):
        return None
    return (
        f"{library} {installed} is installed, but align/compat/ uses its private code as it is in "
        f"{library}{written_for}: install the version pyproject.toml pins (pip install -e .), or, upgrading "
        f"{library}, run tests/test_compat.py against it, fix what fails in align/compat/, and widen "
        "WRITTEN_FOR there"
    )


def check_version(library: str, written_for: str) -> None:
    """Refuse, naming the library, the version installed, the range and what to do, an installed `library`
    outside `written_for`; one not installed is not checked (its own import fails where it is used)."""
    try:
        installed = version(library)
    except PackageNotFoundError:
        return
    if (problem := refusal(library, installed, written_for)) is not None:
        raise UnsupportedVersion(problem)
