"""The registry of distributed backends: name -> a `Backend` (align/backends/base.py). Imports config and
models only; the plan and the stages import it.

Adding one is its module, a line here, and its arithmetic in align/models/memory.py. Importing this is cheap:
each backend imports torch, DeepSpeed or transformers only inside the methods that run in a worker.
"""

from __future__ import annotations

from align.backends.base import Backend
from align.backends.ddp import DDP
from align.backends.fsdp import FSDP
from align.backends.zero2 import Zero2

BACKENDS: dict[str, Backend] = {backend.name: backend for backend in (DDP(), Zero2(), FSDP())}
