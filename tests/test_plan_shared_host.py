"""The plan counts what a stage's ranks share on one host (issue 34, part 4): its memory (ranks x each rank's
host bytes, from the plan's own table), its cores and its GPUs, each refused by its YAML path when the plan
is for this machine; a plan for a cluster checks nothing here. Plans of a model counted from its config
(configs/models), no weights, no Ray."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from align.cli import main
from align.errors import ConfigError
from align.models.memory import format_bytes
from align.pipeline.file import load
from align.planning import hardware
from align.planning.hardware import Hardware, Host, host_memory
from align.planning.host import HostShare, host_share
from align.planning.plan import build
from align.report.console import format_plan
from tests.pipelines import stage, write_pipeline

GB = 10**9
LLAMA_8B = str(Path(__file__).resolve().parents[1] / "configs" / "models" / "llama3-8b")
ROOMY = 100_000 * GB  # a host that holds any of these plans


def on_cpu(memory: int, cores: int = 2) -> Hardware:
    """This machine as `align plan` sees it without GPUs: the device is the host."""
    return Hardware(accelerator=False, device_memory=memory, host=Host(memory, cores))


def on_gpus(host_memory: int, gpus: int = 8) -> Hardware:
    return Hardware(accelerator=True, device_memory=80 * GB, bf16=True, host=Host(host_memory, 16, gpus))


def planned(tmp_path: Path, hardware: Hardware, workers: int = 2, **fields):
    """A full-parameter SFT stage of Llama-3-8B on `workers` ranks, planned for `hardware`."""
    sft = stage("sft", model=LLAMA_8B, **fields)
    return build(load(write_pipeline(tmp_path, "host", {"sft": sft}, workers=workers)), hardware)


def refusals(tmp_path: Path, hardware: Hardware, workers: int = 2, **fields) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        planned(tmp_path, hardware, workers, **fields)
    return [str(problem) for problem in raised.value.problems]


def test_on_a_cpu_the_host_holds_every_rank_whole(tmp_path: Path) -> None:
    """On a CPU the device is the host: each rank's device and offloaded bytes both land in its RAM."""
    sft = planned(tmp_path, on_cpu(ROOMY), workers=3, backend="zero2", zero2={"offload_optimizer": "cpu"})
    sft = sft.stages["sft"]
    share = host_share(sft, accelerator=False)
    assert sft.memory.host.total > 0 and sft.memory.device.total > 0
    assert share.per_rank == sft.memory.device.total + sft.memory.host.total
    assert share.ranks == 3 and share.total == 3 * share.per_rank


def test_with_gpus_the_host_holds_only_what_is_offloaded(tmp_path: Path) -> None:
    sft = planned(tmp_path, on_gpus(ROOMY), workers=8, backend="zero2", zero2={"offload_optimizer": "cpu"})
    sft = sft.stages["sft"]
    share = host_share(sft, accelerator=True)
    assert share.per_rank == sft.memory.host.total > 0
    assert share.total == 8 * sft.memory.host.total
    kept = planned(tmp_path, on_gpus(ROOMY), workers=8, backend="fsdp").stages["sft"]
    assert host_share(kept, accelerator=True).total == 0  # nothing offloaded: the GPUs hold it all


def test_actors_without_a_gpu_add_their_weights_to_the_ranks() -> None:
    share = HostShare(ranks=8, per_rank=2 * GB, actors=16 * GB)
    assert share.total == 32 * GB
    counted = "8 ranks x 2.00 GB + 16.0 GB of actors' weights = 32.0 GB"
    assert share.describe(Host(64 * GB, 16)) == f"{counted} on one host of 64.0 GB (57.6 GB usable)"


def test_ranks_above_the_host_are_refused_and_ranks_it_holds_are_not(tmp_path: Path) -> None:
    """The bound is the plan's usable share of the host (90%), as for a device: a byte over it is refused
    naming ranks x per rank = total, the host and the way out; at the bound it plans."""
    sft = planned(tmp_path, on_cpu(ROOMY), backend="ddp").stages["sft"]
    share = host_share(sft, accelerator=False)
    holds = math.ceil(share.total / 0.9) + 1
    assert planned(tmp_path, on_cpu(holds), backend="ddp").stages["sft"].memory == sft.memory
    tight = math.floor(share.total / 0.9) - 10
    (refused,) = refusals(tmp_path, on_cpu(tight), backend="ddp")
    counted = f"2 ranks x {format_bytes(share.per_rank)} = {format_bytes(share.total)}"
    assert refused.startswith(f"stages.sft.workers: {counted} on one host of {format_bytes(tight)}")
    assert "fewer workers" in refused and "`backend: fsdp`" in refused and "--address" in refused


def test_one_rank_too_big_for_the_host_is_named_by_its_stage(tmp_path: Path) -> None:
    (refused,) = refusals(tmp_path, on_cpu(20 * GB), workers=1)
    assert refused.startswith("stages.sft: 1 rank x ")
    assert "fewer workers" not in refused


def test_offloaded_bytes_of_ranks_on_one_gpu_host_are_added_up(tmp_path: Path) -> None:
    """Each GPU holds its own rank; the host's RAM takes every rank's offloaded optimizer states."""
    fields = {"backend": "zero2", "zero2": {"offload_optimizer": "cpu"}}
    share = host_share(planned(tmp_path, on_gpus(ROOMY), workers=8, **fields).stages["sft"], True)
    (refused,) = refusals(tmp_path, on_gpus(share.total), workers=8, **fields)
    assert refused.startswith(f"stages.sft.workers: 8 ranks x {format_bytes(share.per_rank)} = ")
    assert "less offloaded to the host" in refused


def test_a_plan_for_machines_elsewhere_checks_nothing_here(tmp_path: Path) -> None:
    elsewhere = Hardware(accelerator=False, device_memory=GB)
    assert planned(tmp_path, elsewhere, workers=100_000).stages["sft"].workers == 100_000


def test_cpu_ranks_get_at_least_a_quarter_of_a_core_unless_they_name_their_cpus(tmp_path: Path) -> None:
    assert planned(tmp_path, on_cpu(ROOMY, cores=2), workers=8).stages["sft"].workers == 8
    (refused,) = refusals(tmp_path, on_cpu(ROOMY, cores=2), workers=9)
    assert refused.startswith("stages.sft.workers: 9 CPU ranks would share this machine's 2 cores")
    assert "at most 8 ranks here" in refused
    finer = planned(tmp_path, on_cpu(ROOMY, cores=2), workers=20, resources={"cpus_per_worker": 0.1})
    assert finer.stages["sft"].resources.cpus == 0.1  # named on purpose: 2 CPUs in all, as the machine has


def test_cpus_and_gpus_beyond_the_machine_are_refused_by_their_keys(tmp_path: Path) -> None:
    where = "stages.sft.resources"
    (cpus,) = refusals(tmp_path, on_cpu(ROOMY, cores=2), resources={"cpus_per_worker": 2})
    assert cpus.startswith(f"{where}.cpus_per_worker: 2 ranks x 2 CPUs need 4; this machine has 2")
    (gpus,) = refusals(tmp_path, on_cpu(ROOMY), resources={"gpus_per_worker": 1})
    assert gpus.startswith(f"{where}.gpus_per_worker: 2 ranks x 1 GPUs need 2; this machine has 0")
    (one_gpu,) = refusals(tmp_path, on_gpus(ROOMY, gpus=1), workers=2)
    assert one_gpu.startswith(f"{where}.gpus_per_worker: 2 ranks x 1 GPUs need 2; this machine has 1")


def test_the_plan_prints_the_host_total(tmp_path: Path) -> None:
    plan = planned(tmp_path, on_cpu(ROOMY), backend="ddp")
    share = host_share(plan.stages["sft"], accelerator=False)
    counted = f"2 ranks x {format_bytes(share.per_rank)} = {format_bytes(share.total)}"
    assert f"    host memory: {counted} on one host of {format_bytes(ROOMY)}" in format_plan(plan)
    cluster = planned(tmp_path, Hardware(accelerator=False, device_memory=ROOMY), backend="ddp")
    assert f"    host memory: {counted} if one host runs them all" in format_plan(cluster)


def test_detect_knows_this_host_only_when_the_ranks_run_here(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "local_gpu", lambda: (None, False, 0))
    cores = os.cpu_count()
    assert Hardware.detect(local=True).host == Host(host_memory(), cores, 0)
    assert Hardware.detect("64GB", local=True).host == Host(64 * GB, cores, 0)  # on a CPU: its RAM
    assert Hardware.detect().host is None  # validate: the file, wherever it runs
    assert Hardware.detect("80GB", planning=True, local=True).host is None  # GPUs planned for, elsewhere
    monkeypatch.setattr(hardware, "local_gpu", lambda: (80 * GB, True, 8))
    gpus = Hardware.detect("40GB", planning=True, local=True)
    assert (gpus.device_memory, gpus.host) == (40 * GB, Host(host_memory(), cores, 8))


def test_plan_and_run_refuse_here_and_not_for_a_cluster(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    path = str(write_pipeline(tmp_path, "many", {"sft": stage("sft")}, workers=100_000))
    for command in ("plan", "run"):
        assert main([command, path]) == 2
        assert "stages.sft.workers: 100000 CPU ranks would share" in capsys.readouterr().err
    assert main(["validate", path]) == 0
    assert main(["plan", path, "--address", "10.0.0.5:6379"]) == 0
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert main(["plan", path]) == 0
    assert not (tmp_path / "runs").exists()
