"""`align`: validate, plan, run, submit and report pipelines. The only package that prints for people and
turns errors into exit codes; it may import every package of align (its commands import them lazily).

User errors exit 2 with one readable message and no traceback; a stage that crashes exits 1. Each command
is a module here (its options beside its handler); `arguments.py` puts them in one parser.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from align.cli.arguments import parser as parser  # the CLI reference (scripts/docs_pages.py) reads it
from align.errors import AlignError, Interrupted, StageFailed

EXIT_USER_ERROR = 2


def stop_on(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM stop the run the same way: unwinding, so each stage is set aside cleanly."""
    Interrupted.received = signum
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    # bitsandbytes warns on import that an optional hub kernel is missing; its CPU fallback is used
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    args = parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, stop_on)
        signal.signal(signal.SIGTERM, stop_on)
    try:
        return args.handler(args)
    except AlignError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except StageFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        print("interrupted", file=sys.stderr)
        return 128 + getattr(err, "signum", Interrupted.received)
