"""`align`: validate, plan, run, submit and report pipelines. The only module that prints for people.

User errors exit 2 with one readable message and no traceback; a stage that crashes exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from align.errors import AlignError, ConfigError, Interrupted, StageFailed

EXIT_USER_ERROR = 2


def build_plan(args: argparse.Namespace):
    """The validated file's plan: every check `validate` makes, and every backend refusal, before Ray.
    `plan` and `run` without a cluster (--address, RAY_ADDRESS) plan for this machine, and so refuse what
    its cores, GPUs and memory could never hold; `validate` checks the file, wherever it will run."""
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
    here = args.handler in (cmd_plan, cmd_run) and not cluster
    return build(pipeline, Hardware.detect(memory, planning=args.handler is cmd_plan, local=here))


def loads_models_here(args: argparse.Namespace) -> bool:
    """Whether the command loads the pipeline's models on this machine: `align data` (tokenizers), and a run
    on this machine's Ray. A hub model it cannot load is refused then; elsewhere it is a warning."""
    local_run = args.handler is cmd_run and not (args.address or os.environ.get("RAY_ADDRESS"))
    return args.handler is cmd_data or local_run


def cmd_validate(args: argparse.Namespace) -> int:
    pipeline = build_plan(args).pipeline  # the plan refuses what a chosen backend cannot run
    print(
        f"{args.file}: valid pipeline '{pipeline.name}' with {len(pipeline.stages)} stages "
        f"({', '.join(pipeline.stages)})"
    )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from align.report.console import format_plan

    print(format_plan(build_plan(args)))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    import warnings

    from align.report.rows_view import format_preview, preview

    # TRL's configs set `gradient_checkpointing`, which transformers now warns is renamed: not the user's
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    plan = build_plan(args)
    found = preview(plan, args.stage, None if args.all else args.rows, colour=sys.stdout.isatty())
    print(format_preview(found))
    return 0


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
        again = " ".join(["align", "run", args.file, *resume_options(args)])
        where = str(err) or "stopped between stages (every finished stage is kept)"  # no stage running
        if "\n" in where:  # several stages stopped, one line each
            where = "".join(f"\n  {line}" for line in where.splitlines())
        else:
            where = f" {where}"
        print(f"interrupted:{where}\n`{again}` resumes it", file=sys.stderr)
        return 128 + err.signum
    finally:
        progress.end()
    print(format_outcomes(outcomes))
    if plan.pipeline.sweep is not None:
        from align.report.sweep_report import format_sweep, read_sweep

        print(format_sweep(read_sweep(plan.pipeline, args.file, args.set)))
        print(f"`align sweep-report {args.file}` writes its plot and links the best variant's outputs")
    return 0


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


def cmd_status(args: argparse.Namespace) -> int:
    """A pipeline file or run folder: the local run's stages; anything else is a submitted job's id."""
    target = Path(args.target)
    if target.exists():
        from align.report.status import status_lines

        print("\n".join(status_lines(target)))
        return 0
    if target.suffix in (".yaml", ".yml") or "/" in args.target:
        raise AlignError(f"{target}: no such pipeline file or run folder (a submitted job's id has no '/')")
    from align.run.submit import status

    print(status(args.address, args.target))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from align.run.submit import logs

    print(logs(args.address, args.job_id), end="")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from align.report.pages import write_report
    from align.report.run_folder import load_run

    target = Path(args.target)
    if not target.exists():
        raise AlignError(f"{target}: no such pipeline file or run folder")
    run = load_run(target)
    page, summary = write_report(run, Path(args.out) if args.out else run.folder)
    print(page)
    print(summary)
    return 0


def cmd_sweep_report(args: argparse.Namespace) -> int:
    from align.pipeline.file import load
    from align.report.sweep_report import format_sweep, link_best, read_sweep, write_page

    report = read_sweep(load(args.file, args.set), args.file, args.set)
    links = link_best(report)
    print(format_sweep(report))
    print(write_page(report, links))
    for link in links:
        print(f"{link} -> {os.readlink(link)}")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """Stream the model's replies; `--prompt` answers once and exits, else a conversation until EOF."""
    from align.report.chat import chat_target, load_chat_model, reply

    target = chat_target(args.target, args.stage, args.set)
    model, tokenizer = load_chat_model(target)
    messages = [{"role": "system", "content": args.system}] if args.system else []

    def answer(text: str) -> None:
        messages.append({"role": "user", "content": text})
        said = ""
        for piece in reply(model, tokenizer, messages, args.max_new_tokens, args.temperature):
            print(piece, end="", flush=True)
            said += piece
        print()
        messages.append({"role": "assistant", "content": said})

    if args.prompt is not None:
        answer(args.prompt)
        return 0
    print(f"chatting with {target.said} ({target.base}); Ctrl-D ends", file=sys.stderr)
    while True:
        try:
            text = input("you> ")
        except EOFError:
            print()
            return 0
        if text.strip():
            answer(text)


def cmd_tiny(args: argparse.Namespace) -> int:
    from align.models.loading import resolve_model
    from align.models.tiny import build_tiny_model

    if args.out:
        build_tiny_model(Path(args.out), seed=args.seed)
        print(args.out)
    else:
        print(resolve_model("tiny"))
    return 0


def positive_count(value: str) -> int:
    """A count of one or more (`--rows`): argparse answers anything else as a usage error, exit 2."""
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a count of 1 or more (--all shows every row)")
    return count


def byte_count(value: str) -> int:
    """An argparse type: `100MB`, `1GiB`... (a bad value is a usage error naming the option, exit 2)."""
    from align.models.memory import parse_memory

    try:
        return parse_memory(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size: write e.g. 100MB or 1GiB") from None


def stage_names(sub: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    """A repeatable option that names a stage."""
    sub.add_argument(flag, action="append", default=[], metavar="NAME", help=help_text)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="align", description="Alignment pipelines declared in YAML, run on Ray."
    )
    commands = top.add_subparsers(dest="command", required=True)

    def pipeline_command(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("file", help="the pipeline YAML file")
        sub.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY.PATH=VALUE",
            help="override a value, e.g. stages.dpo.trl.beta=0.2 (repeatable)",
        )
        sub.set_defaults(handler=handler)
        return sub

    pipeline_command("validate", cmd_validate, "check a pipeline file without loading anything")
    data = pipeline_command(
        "data", cmd_data, "a stage's rows as its trainer sees them, loss-bearing tokens marked, and lengths"
    )
    data.add_argument("--stage", help="the stage whose rows to show (default: the first that reads rows)")
    data.add_argument("--rows", type=positive_count, default=3, help="how many rows to show (default 3)")
    data.add_argument("--all", action="store_true", help="show every row")
    for name, handler, help_text in (
        ("plan", cmd_plan, "show stages, backends, placement and memory per rank"),
        ("run", cmd_run, "run the pipeline (an embedded Ray unless --address)"),
        ("submit", cmd_submit, "send the run to a Ray cluster as a job"),
    ):
        sub = pipeline_command(name, handler, help_text)
        if name != "submit":
            sub.add_argument(
                "--device-memory", help="memory per device for the plan, e.g. 80GB (default: detected)"
            )
        if name == "plan":
            sub.add_argument(
                "--address",
                help="the Ray cluster the run will join: plan for it, checking nothing against this "
                "machine's cores, GPUs and memory (default: $RAY_ADDRESS, else this machine)",
            )
        if name != "plan":
            stage_names(sub, "--stage", "run this stage (and what it needs) only; repeatable")
            stage_names(sub, "--force", "rerun this stage and everything downstream of it; repeatable")
        if name == "run":
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
        if name == "submit":
            sub.add_argument(
                "--address", required=True, help="the cluster's dashboard, e.g. http://HOST:8265"
            )
            sub.add_argument(
                "--pack-limit",
                type=byte_count,
                default="100MB",
                help="local files (data, configs) sent with the job, in all (default 100MB); larger ones "
                "and model folders must be on storage every node sees",
            )
    dashboard = os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")
    status = commands.add_parser(
        "status",
        help="where a run stands: each stage done, running (step, ETA), interrupted, failed or pending",
    )
    status.add_argument("target", help="a pipeline YAML file or its run folder; or a submitted job's id")
    status.add_argument("--address", default=dashboard, help="the cluster's dashboard, for a job id")
    status.set_defaults(handler=cmd_status)
    logs = commands.add_parser("logs", help="a submitted job's logs")
    logs.add_argument("job_id", help="the id `align submit` printed")
    logs.add_argument("--address", default=dashboard, help="the cluster's dashboard (default: $RAY_ADDRESS)")
    logs.set_defaults(handler=cmd_logs)
    report = commands.add_parser(
        "report", help="write a run's report: report.html (plots inline) and report.md, beside the run"
    )
    report.add_argument("target", help="the pipeline YAML file, or its run folder (runs/<pipeline>)")
    report.add_argument("--out", help="the folder to write into (default: the run folder)")
    report.set_defaults(handler=cmd_report)
    pipeline_command(
        "sweep-report",
        cmd_sweep_report,
        "a sweep's variants ranked with 95%% intervals, the best and whether the data separate it from the "
        "runner-up; writes sweep-report.md and its plot, and links the best's outputs as best/STAGE",
    )
    chat = commands.add_parser("chat", help="talk to a model, or a stage's output, streaming its replies")
    chat.add_argument("target", help="a model folder (or builtin, hub id), or a pipeline YAML file")
    chat.add_argument("--stage", help="with a pipeline file: the stage whose output to load (default: last)")
    chat.add_argument("--prompt", help="answer this once and exit (for scripts)")
    chat.add_argument("--system", help="a system message before the conversation")
    chat.add_argument("--max-new-tokens", type=int, default=256, help="the longest reply, in tokens")
    chat.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the default)")
    chat.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as for `align run`")
    chat.set_defaults(handler=cmd_chat)
    tiny = commands.add_parser("tiny", help="build the tiny random-init Llama (into the cache, or OUT)")
    tiny.add_argument(
        "out", nargs="?", help="the folder to write (default: align's cache, where `tiny` is read)"
    )
    tiny.add_argument("--seed", type=int, default=0, help="the seed of its random weights")
    tiny.set_defaults(handler=cmd_tiny)
    return top


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


if __name__ == "__main__":
    sys.exit(main())
