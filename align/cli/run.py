"""`align run` (an embedded Ray, or a cluster's) and `align submit` (the run sent to a cluster as a job)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from align.cli.options import byte_count, device_memory, pipeline_command, stage_names
from align.cli.plan_file import build_plan
from align.errors import AlignError, Interrupted


def resume_options(args: argparse.Namespace) -> list[str]:
    """The options that rerun what an interrupted `align run` was running: its stage selection and
    settings, and its forced (or restarted) stages forced again, which picks up their kept attempts."""
    return [
        *(f"--set {item}" for item in args.set),
        *(f"--stage {name}" for name in args.stage),
        *(f"--force {name}" for name in [*args.force, *args.restart]),
    ]


def cmd_run(args: argparse.Namespace) -> int:
    from align.report.console import ProgressLine, format_outcomes
    from align.run.controller import run_plan

    plan = build_plan(args)  # without a cluster, refuses what this machine could never hold
    if plan.pipeline.sweep is not None and (args.stage or args.force or args.restart):
        raise AlignError(
            "--stage, --force and --restart pick stages of a pipeline without `sweep:`: remove them"
        )
    progress = ProgressLine(sys.stdout)
    settings = {
        "address": args.address,
        "verbose": args.verbose,
        "on_event": progress.event,
        "on_progress": progress.update,
        "on_end": progress.ended,
        "command": " ".join(["align", *sys.argv[1:]]),
    }
    try:
        if plan.pipeline.sweep is not None:
            from align.run.sweep import run_sweep

            outcomes = run_sweep(plan, **settings)
        else:
            outcomes = run_plan(plan, only=args.stage, force=args.force, restart=args.restart, **settings)
    except Interrupted as err:
        progress.end()
        print(interrupted_message(args, err), file=sys.stderr)
        return 128 + err.signum
    finally:
        progress.end()
    print(format_outcomes(outcomes))
    if plan.pipeline.sweep is not None:
        from align.report.sweep_report import format_sweep, read_sweep

        print(format_sweep(read_sweep(plan.pipeline, args.file, args.set)))
        print(f"`align sweep-report {args.file}` writes its plot and links the best variant's outputs")
    return 0


def interrupted_message(args: argparse.Namespace, err: Interrupted) -> str:
    """Where the run stopped (one line per stopped stage) and the command that resumes it."""
    again = " ".join(["align", "run", args.file, *resume_options(args)])
    where = str(err) or "stopped between stages (every finished stage is kept)"  # no stage running
    if "\n" in where:  # several stages stopped, one line each
        where = "".join(f"\n  {line}" for line in where.splitlines())
    else:
        where = f" {where}"
    return f"interrupted:{where}\n`{again}` resumes it"


def cmd_submit(args: argparse.Namespace) -> int:
    from align.pipeline.file import resolved
    from align.report.console import format_package
    from align.run import package
    from align.run.launch import worker_env
    from align.run.lock import check_free
    from align.run.records import pipeline_dir
    from align.run.submit import submit

    pipeline = build_plan(args).pipeline  # refuse here what `validate` refuses, before it reaches the cluster
    check_free(pipeline_dir(pipeline.defaults.output_root, pipeline.name))  # a run here holds it
    packed = package.build(Path(args.file), resolved(Path(args.file), args.set), pipeline, args.pack_limit)
    print(format_package(packed))
    job_id = submit(
        args.address,
        packed.folder,
        packed.pipeline_file,
        only=args.stage,
        force=args.force,
        env=worker_env([]),  # the job's working directory is the packed folder
    )
    print(job_id)
    return 0


def add_run(commands) -> None:
    sub = pipeline_command(commands, "run", cmd_run, "run the pipeline (an embedded Ray unless --address)")
    device_memory(sub)
    stage_names(sub, "--stage", "run this stage (and what it needs) only; repeatable")
    stage_names(sub, "--force", "rerun this stage and everything downstream of it; repeatable")
    sub.add_argument("--address", help="a Ray cluster to run on (default: $RAY_ADDRESS, else local)")
    stage_names(
        sub,
        "--restart",
        "run this stage again from step 0, discarding its checkpoints (and rerun what depends on "
        "it); without it an interrupted stage resumes",
    )
    sub.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="stream the workers' output (always in their logs)",
    )


def add_submit(commands) -> None:
    sub = pipeline_command(commands, "submit", cmd_submit, "send the run to a Ray cluster as a job")
    stage_names(sub, "--stage", "run this stage (and what it needs) only; repeatable")
    stage_names(sub, "--force", "rerun this stage and everything downstream of it; repeatable")
    sub.add_argument("--address", required=True, help="the cluster's dashboard, e.g. http://HOST:8265")
    sub.add_argument(
        "--pack-limit",
        type=byte_count,
        default="100MB",
        help="local files (data, configs) sent with the job, in all (default 100MB); larger ones "
        "and model folders must be on storage every node sees",
    )
