"""Every use of another library's private code, one module per library, each checked at import against the
versions it was written for (versions.py). Imports errors only; backends, data, trainers, stages, run use it.

A module here imports its library inside the functions that need it (`align validate` and `align plan`
import compat modules and stay free of torch and TRL), except transformers.py, which only trainers/ import.
tests/test_compat.py holds one contract test per entry and the scan that keeps private names out of the rest.
"""
