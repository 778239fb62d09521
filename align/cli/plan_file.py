"""The pipeline file a command names, read, checked and planned: every check `validate` makes, and every
backend refusal, before Ray."""

from __future__ import annotations

import argparse
import os
import sys

from align.errors import ConfigError


def build_plan(args: argparse.Namespace):
    """The validated file's plan. `plan` and `run` without a cluster (--address, RAY_ADDRESS) plan for this
    machine, and so refuse what its cores, GPUs and memory could never hold; `validate` checks the file,
    wherever it will run."""
    from align.pipeline.file import load
    from align.planning.hardware import Hardware
    from align.planning.plan import build

    pipeline = load(args.file, getattr(args, "set", None) or [])
    if pipeline.absent and loads_models_here(args):
        raise ConfigError(list(pipeline.absent), source=args.file)
    for warning in [*pipeline.warnings, *pipeline.absent]:
        print(f"warning: {warning}", file=sys.stderr)
    memory = getattr(args, "device_memory", None) or pipeline.defaults.device_memory
    cluster = getattr(args, "address", None) or os.environ.get("RAY_ADDRESS")
    here = args.command in ("plan", "run") and not cluster
    return build(pipeline, Hardware.detect(memory, planning=args.command == "plan", local=here))


def loads_models_here(args: argparse.Namespace) -> bool:
    """Whether the command loads the pipeline's models on this machine: `align data` (tokenizers), and a run
    on this machine's Ray. A hub model it cannot load is refused then; elsewhere it is a warning."""
    local_run = args.command == "run" and not (args.address or os.environ.get("RAY_ADDRESS"))
    return args.command == "data" or local_run
