"""What a stage asks Ray for: `resources:` in defaults and per stage, printed by `align plan`, a request this
machine cannot hold refused before Ray starts (it would wait forever), and where a group's ranks land."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from align.cli import main
from align.errors import AlignError
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.plan import build
from align.planning.resources import shared_cpus
from align.report.status import where_ranks_ran
from align.run.ray_stages import check_shared
from align.run.workers import GroupShape, rank_order
from tests.fake_records import a_record
from tests.pipelines import stage, write_pipeline

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)


def plan_of(tmp_path: Path, **defaults):
    stages = {"sft": stage("sft", resources={"cpus_per_worker": 0.5}), "dpo": stage("dpo")}
    return build(load(write_pipeline(tmp_path, "res", stages, workers=2, **defaults)), CPU)


def test_a_stage_takes_its_own_keys_over_the_defaults(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, resources={"wait_s": 30, "strategy": "spread"})
    sft, dpo = plan.stages["sft"].resources, plan.stages["dpo"].resources
    assert (sft.cpus, sft.wait_s, sft.strategy) == (0.5, 30, "spread")
    assert (dpo.cpus, dpo.wait_s, dpo.gpus) == (None, 30, 0.0)
    assert GroupShape.of(plan.stages["sft"], gpu=False, embedded=True).bundle == (("CPU", 0.5),)


def test_unset_cpus_share_this_machine_on_an_embedded_ray_and_take_one_on_a_cluster(tmp_path: Path) -> None:
    """A stage's ranks split the cores; stages side by side split them first (sft and dpo read nothing,
    so a run starts both at once), each stage its equal part."""
    dpo = plan_of(tmp_path).stages["dpo"]
    assert dpo.resources.alongside == 2

    def cpus(stage, embedded: bool = True) -> float:
        return dict(GroupShape.of(stage, gpu=False, embedded=embedded).bundle)["CPU"]

    beside, alone = cpus(dpo), cpus(replace(dpo, resources=replace(dpo.resources, alongside=1)))
    assert alone * 2 <= os.cpu_count() and alone > os.cpu_count() / 2 - 0.01
    assert beside * 4 <= os.cpu_count() and beside > os.cpu_count() / 4 - 0.01
    assert cpus(dpo, embedded=False) == 1.0
    assert shared_cpus(1, alongside=2) == os.cpu_count() / 2  # two 1-rank stages: half the cores each


def test_plan_says_the_share_of_stages_that_start_together(tmp_path: Path, capsys) -> None:
    """Two children of one stage start together; the parent and the stage that reads both run alone."""
    child = stage("dpo", model="${stages.sft.output}")
    models = {"left": "${stages.left.output}", "right": "${stages.right.output}"}
    data, rewards = {"prompts": "align:toy/number-or-word/test"}, [{"function": "exact_answer"}]
    both = {"kind": "eval", "models": models, "data": data, "rewards": rewards}
    stages = {"sft": stage("sft"), "left": child, "right": child, "last": both}
    path = write_pipeline(tmp_path, "fork", stages)
    plan = build(load(path), CPU)
    assert {name: s.resources.alongside for name, s in plan.stages.items()} == {
        "sft": 1,
        "left": 2,
        "right": 2,
        "last": 1,
    }
    assert main(["plan", str(path)]) == 0
    out, cores = capsys.readouterr().out, os.cpu_count()
    share = f"beside 1 other stage: {shared_cpus(1, 2):g} of this machine's {cores} cores"
    assert out.count(f"embedded: {share} (all {cores} when it runs alone") == 2
    assert out.count(f"embedded: the rank takes this machine's {cores} cores (1 CPU on a cluster)") == 2


def test_plan_prints_each_request(tmp_path: Path, capsys) -> None:
    """A plan for a cluster (`--address`) checks nothing against this machine, which has no A100s."""
    path = write_pipeline(tmp_path, "res", {"sft": stage("sft", resources={"custom": {"A100": 1}})})
    assert main(["plan", str(path), "--address", "10.0.0.5:6379"]) == 0
    assert "resources: 1 x {CPU: shared, A100: 1} (pack), waiting at most 600 s" in capsys.readouterr().out


def test_a_request_this_machine_cannot_hold_is_refused_before_ray_starts(tmp_path: Path, capsys) -> None:
    cores = os.cpu_count()
    resources = {"cpus_per_worker": cores, "custom": {"A100": 1}}
    path = write_pipeline(tmp_path, "res", {"sft": stage("sft", resources=resources)}, workers=2)
    env = {key: os.environ.pop(key) for key in ("RAY_ADDRESS",) if key in os.environ}
    try:
        assert main(["run", str(path)]) == 2
    finally:
        os.environ.update(env)
    err = capsys.readouterr().err
    assert f"stages.sft.resources.cpus_per_worker: 2 ranks x {cores} CPUs need {2 * cores}" in err
    assert "stages.sft.resources.custom: A100: an embedded Ray has no custom resources" in err
    assert not (tmp_path / "runs").exists()


def test_ranks_of_one_node_come_together_whatever_order_ray_started_them() -> None:
    places = [("10.0.0.1", [], "b"), ("10.0.0.1", [], "a"), ("10.0.0.1", [], "b"), ("10.0.0.1", [], "a")]
    assert rank_order(places) == [0, 2, 1, 3]  # two nodes behind one IP, told apart by id


def test_plan_says_what_this_machine_makes_of_a_cpu_request(tmp_path: Path, capsys) -> None:
    """More CPU ranks than cores share them (fractions of a CPU); a fixed request it cannot hold is refused
    by the plan, as by `align run` without --address, naming the key."""
    cores = os.cpu_count()
    path = write_pipeline(tmp_path, "res", {"sft": stage("sft")}, workers=cores + 1)
    assert main(["plan", str(path)]) == 0
    each = f"{int(cores / (cores + 1) * 10_000) / 10_000:g}"
    line = f"embedded: {cores + 1} ranks share this machine's {cores} cores ({each} CPU each, 1 on a cluster)"
    assert line in capsys.readouterr().out
    assert main(["plan", str(path), "--set", "defaults.resources.cpus_per_worker=1"]) == 2
    need = f"stages.sft.resources.cpus_per_worker: {cores + 1} ranks x 1 CPUs need {cores + 1}"
    assert need in capsys.readouterr().err


def test_status_says_where_each_rank_ran() -> None:
    ranks = [
        {"rank": 0, "node_ip": "10.0.0.5", "node_id": "3f2a01", "local_rank": 0, "gpus": ["0"]},
        {"rank": 1, "node_ip": "10.0.0.6", "node_id": "9c1b02", "local_rank": 0, "gpus": ["3"]},
    ]
    assert where_ranks_ran(a_record(ranks=ranks)) == (
        ", ranks on 2 nodes (0: 10.0.0.5/3f2a local 0 GPU 0, 1: 10.0.0.6/9c1b local 0 GPU 3)"
    )
    assert where_ranks_ran(a_record()) == ""


def test_a_rank_that_cannot_read_the_output_root_is_named(tmp_path: Path) -> None:
    """Every rank of a new group reads back a probe the driver wrote in the output root; one on a node
    without that storage is named in one line, and the probe is removed either way."""

    class Group:
        placement = [{"node_ip": "10.0.0.5"}, {"node_ip": "10.0.0.6"}]

        def unreadable(self, probe: str, expected: str) -> list[int]:
            seen = [Path(probe).read_text() == expected, False]  # rank 1's node lacks the storage
            return [rank for rank, sees in enumerate(seen) if not sees]

    with pytest.raises(AlignError) as refused:
        check_shared(Group(), tmp_path)
    assert str(refused.value) == (
        f"rank(s) 1 on node(s) 10.0.0.6 cannot read {tmp_path}: the output root must be shared storage that "
        "every node mounts at the same path"
    )
    assert not list(tmp_path.iterdir())


def test_a_named_address_where_nothing_answers_is_refused_in_one_line(tmp_path: Path) -> None:
    """Ray's own join to it retries for many minutes."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"  # bound, never listening
        path = write_pipeline(tmp_path, "gone", {"sft": stage("sft")})
        command = [sys.executable, "-m", "align.cli", "run", str(path), "--address", address]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        done.stderr.strip().splitlines()[-1]
        == f"error: cannot join the Ray cluster at {address}: nothing answers there"
    )
