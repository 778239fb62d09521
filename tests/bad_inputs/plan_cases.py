"""What the ranks of a stage share on this machine (issue 34, part 4): its memory, its cores and its GPUs.
`align plan` and `align run` without --address plan for this machine and refuse what it could never hold,
naming the YAML path, the total and the way out, before Ray starts. Models counted from their published
config.json (configs/models), written beside the pipeline: no weights."""

from pathlib import Path

from tests.bad_inputs import Case, pipeline

MODELS = Path(__file__).resolve().parents[2] / "configs" / "models"
LLAMA_8B = {"m8b/config.json": (MODELS / "llama3-8b" / "config.json").read_text()}
LLAMA_70B = {"m70b/config.json": (MODELS / "llama3-70b" / "config.json").read_text()}
SFT = "sft:\n  kind: sft\n  data: {train: align:chatterbot/sft/train}\n"
DPO = "dpo:\n  kind: dpo\n  model: ${stages.sft.output}\n  data: {train: align:chatterbot/prefs/train}\n"
SHARED_CORES = ("stages.sft.workers: 100000 CPU ranks would share this machine's", "at most")


def on(model: str, defaults: str, stages: str = SFT) -> str:
    """A pipeline of `stages` on `model` with the `defaults:` block `defaults` (a YAML flow mapping)."""
    return pipeline(stages, header=f"name: bad\nbase_model: {model}\ndefaults: {defaults}\n")


def with_resources(resources: str) -> str:
    return on("tiny", "{workers: 2}", SFT + f"  resources: {resources}\n")


def with_batch(size: int) -> str:
    return on("./m8b", "{workers: 2}", SFT + f"  trl: {{per_device_train_batch_size: {size}}}\n")


CASES = [
    Case("plan-workers-100000", ("plan", "{pipeline}"), on("tiny", "{workers: 100000}"), expect=SHARED_CORES),
    Case("run-workers-100000", ("run", "{pipeline}"), on("tiny", "{workers: 100000}"), expect=SHARED_CORES),
    Case(
        "plan-workers-100000-set-on-the-command-line",
        ("plan", "{pipeline}", "--set", "defaults.workers=100000"),
        on("tiny", "{workers: 2}"),
        expect=SHARED_CORES,
    ),
    Case(
        "plan-too-many-ranks-in-two-stages-at-once",
        ("plan", "{pipeline}"),
        on("tiny", "{workers: 100000}", SFT + DPO),
        expect=(*SHARED_CORES, "stages.dpo.workers: 100000 CPU ranks"),
    ),
    Case(
        "plan-70b-ranks-share-one-host",
        ("plan", "{pipeline}"),
        on("./m70b", "{workers: 8}"),
        files=LLAMA_70B,
        expect=("stages.sft.workers: 8 ranks x ", " on one host of ", "fewer workers", "--address"),
    ),
    Case(
        "run-70b-ranks-share-one-host",
        ("run", "{pipeline}"),
        on("./m70b", "{workers: 8, backend: fsdp}", SFT + "  fsdp: {cpu_offload: true}\n"),
        files=LLAMA_70B,
        expect=("stages.sft.workers: 8 ranks x ", " on one host of ", "fewer workers"),
    ),
    Case(
        "plan-70b-one-rank-beyond-the-host",
        ("plan", "{pipeline}"),
        on("./m70b", "{workers: 1}"),
        files=LLAMA_70B,
        expect=("stages.sft: 1 rank x ", " on one host of ", "a cluster with --address"),
    ),
    Case(
        "run-8b-ddp-ranks-on-a-host-of-device-memory",
        ("run", "{pipeline}", "--device-memory", "64GB"),  # on a CPU the device is the host: its RAM
        on("./m8b", "{workers: 2, backend: ddp}"),
        files=LLAMA_8B,
        expect=(
            "stages.sft.workers: 2 ranks x ",
            "on one host of 64.0 GB (57.6 GB usable)",
            "`backend: fsdp`",
        ),
    ),
    Case(
        "plan-cpus-per-worker-beyond-the-machine",
        ("plan", "{pipeline}"),
        with_resources("{cpus_per_worker: 100000}"),
        expect=("stages.sft.resources.cpus_per_worker: 2 ranks x 100000 CPUs need 200000; this machine has",),
    ),
    Case(
        "run-cpus-per-worker-beyond-the-machine",
        ("run", "{pipeline}"),
        with_resources("{cpus_per_worker: 100000}"),
        expect=("stages.sft.resources.cpus_per_worker:", "--address"),
    ),
    Case(
        "plan-gpus-beyond-the-machine",
        ("plan", "{pipeline}"),
        with_resources("{gpus_per_worker: 1000}"),
        expect=("stages.sft.resources.gpus_per_worker: 2 ranks x 1000 GPUs need 2000; this machine has",),
    ),
    Case(
        "plan-custom-resource-on-an-embedded-ray",
        ("plan", "{pipeline}"),
        with_resources("{custom: {A100: 1}}"),
        expect=("stages.sft.resources.custom: A100: an embedded Ray has no custom resources",),
    ),
    Case(
        "plan-batch-size-zero-counted-by-the-memory-plan",
        ("plan", "{pipeline}"),
        with_batch(0),
        files=LLAMA_8B,
        expect=("stages.sft.trl.per_device_train_batch_size",),
    ),
    Case(
        "plan-negative-batch-size-counted-by-the-memory-plan",
        ("plan", "{pipeline}"),
        with_batch(-4),
        files=LLAMA_8B,
        expect=("stages.sft.trl.per_device_train_batch_size",),
    ),
]
