"""What counts as a secret, so that none reaches a record, a log, a printed line or a pickled config."""

from __future__ import annotations

import re
from typing import Any

SECRET_NAME = re.compile(r"(^|_)(token|key|secret|password|credentials?)$|api_key|access_key", re.IGNORECASE)
SPECIAL_TOKENS = {
    "pad_token",
    "eos_token",
    "bos_token",
    "unk_token",
    "sep_token",
    "cls_token",
    "mask_token",
    "stop_token",
}
"""Tokenizer and generation settings whose names end in `_token` but hold a vocabulary entry, not a secret
(PPO's `stop_token: eos` emptied as a secret made generation run past the end of every completion)."""
MASK = "***"


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name)) and name.lower() not in SPECIAL_TOKENS


def redact(value: Any) -> Any:
    """A copy of a config with every secret-named value masked, for records, logs and messages."""
    if isinstance(value, dict):
        return {k: MASK if is_secret_name(str(k)) and v else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value
