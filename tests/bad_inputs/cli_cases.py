"""The command line itself: unknown commands and options, bad option values."""

from tests.bad_inputs import Case

CASES = [
    Case("no-command", argv=(), expect=("required",)),
]
