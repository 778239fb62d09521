"""`align tiny`: build the tiny random-init Llama the tests and demos train."""

from __future__ import annotations

import argparse
from pathlib import Path


def cmd_tiny(args: argparse.Namespace) -> int:
    from align.models.loading import resolve_model
    from align.models.tiny import build_tiny_model

    if args.out:
        build_tiny_model(Path(args.out), seed=args.seed)
        print(args.out)
    else:
        print(resolve_model("tiny"))
    return 0


def add_tiny(commands) -> None:
    tiny = commands.add_parser("tiny", help="build the tiny random-init Llama (into the cache, or OUT)")
    tiny.add_argument(
        "out", nargs="?", help="the folder to write (default: align's cache, where `tiny` is read)"
    )
    tiny.add_argument("--seed", type=int, default=0, help="the seed of its random weights")
    tiny.set_defaults(handler=cmd_tiny)
