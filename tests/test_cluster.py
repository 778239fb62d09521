"""A real multi-node Ray on loopback: two `ray start` nodes of one CPU each (token auth off, their own
Ray temp folder), started and stopped by their own process groups, never `ray stop`. Stages reserve one
bundle per rank all at once: a 2-rank stage spreads over both nodes, a 1-rank stage after it runs (it once
asked for the cluster's total and waited forever), a request no node holds fails within its `wait_s`,
SIGTERM stops a run as Ctrl-C does (in the reservation's wait and mid-stage), a run with no `--address`
joins the head running on this machine (and a stale pointer to a killed head is named, an embedded Ray
used), two stages of one parent run at once, one on each node (and so do a sweep's two variants, as Ray
Tune trials), and a node lost mid-stage is retried from its checkpoint on the nodes left when they hold the
stage, and ends the stage in one line when they cannot. `make test-cluster`."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.pipelines import SFT_DATA, running_step, stage, stage_folder, stage_record, write_pipeline

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
DATA = {**SFT_DATA, "max_train_rows": 32, "max_eval_rows": 8}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_node(*args: str, log: Path, env: dict) -> subprocess.Popen:
    command = [
        str(BIN / "ray"),
        "start",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--num-cpus",
        "1",
        "--disable-usage-stats",
        *args,
    ]
    return subprocess.Popen(
        command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def wait_for_nodes(address: str, count: int, env: dict, timeout: float = 120) -> None:
    probe = f"import ray; ray.init(address={address!r}); print(len([n for n in ray.nodes() if n['Alive']]))"
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(2)
    raise TimeoutError(f"the cluster at {address} did not reach {count} nodes in {timeout:.0f} s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(address, env, nodes): a head and one more node on loopback, one CPU each, stopped afterwards.

    Its Ray temp folder is its own (RAY_TMPDIR, short for Ray's socket paths): the pointer its head
    leaves there is seen only by the runs given this env, not by other runs on the machine, which would
    otherwise join this head instead of starting their embedded Ray."""
    folder = tmp_path_factory.mktemp("cluster")
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_TMPDIR": str(temp),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "HF_HUB_OFFLINE": "1",
    }
    port = free_port()
    address = f"127.0.0.1:{port}"
    nodes = [
        start_node(
            "--head", "--port", str(port), "--include-dashboard=false", log=folder / "head.log", env=env
        )
    ]
    try:
        time.sleep(5)
        nodes.append(start_node("--address", address, log=folder / "node.log", env=env))
        wait_for_nodes(address, 2, env)
        yield address, env, nodes
    finally:
        for node in reversed(nodes):
            stop_node(node)
        pointer = temp / "ray" / "ray_current_cluster"
        if pointer.is_file() and pointer.read_text().strip().endswith(f":{port}"):
            pointer.unlink()  # the pointer our head left (in our own temp folder)
        shutil.rmtree(temp, ignore_errors=True)


def stop_node(node: subprocess.Popen) -> None:
    """Stop one `ray start --block` node by its own process group (never `ray stop`: it stops every Ray
    on the machine)."""
    try:
        os.killpg(node.pid, signal.SIGTERM)
        node.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.pid, signal.SIGKILL)
        node.wait(timeout=10)
    except ProcessLookupError:
        node.wait(timeout=10)


def align(*args: str, env: dict, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "align.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def align_lines(output: str) -> list[str]:
    """What align printed (its own lines start with `ray:` or `[stage]`), without lines libraries print."""
    return [line for line in output.splitlines() if re.match(r"ray: |\[[A-Za-z_][\w-]*\] ", line)]


def start_run(path: Path, address: str, env: dict) -> subprocess.Popen:
    command = [sys.executable, "-m", "align.cli", "run", str(path), "--address", address]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_file(folder: Path, pattern: str, run: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not list(folder.glob(pattern)):
        assert time.time() < deadline and run.poll() is None, f"no {pattern} in {folder}"
        time.sleep(0.5)


def wait_for_step(folder: Path, step: int, run: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while running_step(folder) < step:
        assert time.time() < deadline and run.poll() is None, f"no step {step} in {folder}"
        time.sleep(0.2)


def stage_workers(nodes: list[subprocess.Popen]) -> list[str]:
    """The rank processes still running under the cluster's nodes."""
    below = [p for node in nodes for p in psutil.Process(node.pid).children(recursive=True)]
    running = []
    for process in below:
        with contextlib.suppress(psutil.Error):
            if "StageWorker" in " ".join(process.cmdline()):
                running.append(process.cmdline()[0])
    return running


def nodes_of(path: Path, name: str) -> list[str]:
    return [rank["node_id"] for rank in stage_record(path, name)["ranks"]]


def test_a_stale_pointer_to_a_killed_head_is_named_and_an_embedded_ray_runs(tmp_path):
    """Before the cluster starts: a pointer in Ray's temp folder to a head that no longer answers (as a
    killed head leaves it) made `ray.init(num_cpus=...)` raise; the run names it and starts its own Ray."""
    temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    try:
        (temp / "ray").mkdir()
        dead = f"127.0.0.1:{free_port()}"
        (temp / "ray" / "ray_current_cluster").write_text(dead)
        env = {**os.environ, "RAY_TMPDIR": str(temp), "HF_HUB_OFFLINE": "1"}
        env.pop("RAY_ADDRESS", None)
        path = write_pipeline(tmp_path, "stale", {"sft": stage("sft", steps=2, batch=2, data=DATA)})
        done = align("run", str(path), env=env)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert align_lines(done.stdout)[0] == (
        f"ray: embedded on this machine, {os.cpu_count()} CPUs (the pointer to a Ray head at {dead} left in "
        "Ray's temp folder is stale: no head answers)"
    )
    assert "Traceback" not in done.stderr


def test_two_ranks_spread_then_one_rank_then_two_again(cluster, tmp_path):
    address, env, _ = cluster
    stages = {
        "sft": stage("sft", steps=2, batch=2, data=DATA, lora={"r": 4}, workers=2),
        "merge": {"kind": "merge", "model": "${stages.sft.output}"},
        "again": stage("sft", steps=2, batch=2, data=DATA, model="${stages.merge.output}", workers=2),
    }
    path = write_pipeline(tmp_path, "spread", stages, precision="fp32", seed=0)
    done = align("run", str(path), "--address", address, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert align_lines(done.stdout)[0].startswith(f"ray: joined the cluster at {address} (named): 2 node(s)")
    assert len(set(nodes_of(path, "sft"))) == 2  # one CPU a node: the two ranks must be on both
    assert len(nodes_of(path, "merge")) == 1
    assert len(set(nodes_of(path, "again"))) == 2
    status = align("status", str(path), env=env).stdout
    assert "ranks on 2 nodes" in [line for line in status.splitlines() if line.strip().startswith("sft")][0]
    ranks = stage_record(path, "sft")["ranks"]
    assert [rank["local_rank"] for rank in ranks] == [0, 0] and all(rank["node_ip"] for rank in ranks)


def test_two_stages_of_one_parent_run_at_once_one_on_each_node(cluster, tmp_path):
    """One CPU a node: the children, ready together, reserve one node each and overlap in time."""
    address, env, _ = cluster
    child = {"steps": 4, "batch": 2, "data": DATA, "model": "${stages.sft.output}"}
    stages = {
        "sft": stage("sft", steps=2, batch=2, data=DATA, lora={"r": 4}),
        "left": stage("sft", **child, lora={"r": 4}),
        "right": stage("sft", **child, lora={"r": 8}),
    }
    path = write_pipeline(tmp_path, "fork", stages, precision="fp32", seed=0)
    done = align("run", str(path), "--address", address, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    left, right = stage_record(path, "left"), stage_record(path, "right")
    assert left["started"] < right["ended"] and right["started"] < left["ended"]
    assert len({*nodes_of(path, "left"), *nodes_of(path, "right")}) == 2  # a node each


def test_a_sweeps_variants_run_at_once_one_on_each_node(cluster, tmp_path):
    """Two variants as Ray Tune trials, each on its trial's placement group: one CPU a node, a node each."""
    address, env, _ = cluster
    stages = {"sft": stage("sft", steps=4, batch=2, data=DATA, lora={"r": 4})}
    path = write_pipeline(tmp_path, "swept", stages, precision="fp32", seed=0)
    sweep = {"parameters": {"stages.sft.lora.r": [4, 8]}, "metric": "sft/train_loss_last", "mode": "min"}
    path.write_text(path.read_text() + "sweep: " + json.dumps(sweep) + "\n")  # JSON is YAML
    done = align("run", str(path), "--address", address, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    four, eight = stage_record(path, "sft[r=4]"), stage_record(path, "sft[r=8]")
    assert four["started"] < eight["ended"] and eight["started"] < four["ended"]
    assert len({*nodes_of(path, "sft[r=4]"), *nodes_of(path, "sft[r=8]")}) == 2  # a node each
    assert "sweep of sft: 2 variants by sft/train_loss_last" in done.stdout


def test_a_request_no_node_holds_fails_within_its_wait(cluster, tmp_path):
    address, env, _ = cluster
    resources = {"cpus_per_worker": 2, "wait_s": 20}
    path = write_pipeline(tmp_path, "big", {"sft": stage("sft", data=DATA, resources=resources)})
    started = time.monotonic()
    done = align("run", str(path), "--address", address, env=env)
    assert time.monotonic() - started < 20 + 60  # the wait, plus joining and the record
    assert done.returncode == 2
    error = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert error == [
        "error: stage 'sft': Ray could not reserve 1 x {CPU: 2} (pack) in 20 s; the largest node has "
        "{CPU: 1}: lower `resources:` or `workers:`, or add nodes; check `ray status`"
    ]
    assert "Traceback" not in done.stderr
    waiting = r"\[sft\] waiting 1\d s for 1 x \{CPU: 2\} \(pack\); free per node: \{CPU: 1\}; \{CPU: 1\}"
    assert re.search(waiting, done.stdout), done.stdout[-2000:]  # at 15 s, what is asked and what is free


def test_sigterm_while_the_stage_waits_for_its_reservation(cluster, tmp_path):
    """SIGTERM while Ray cannot yet reserve the stage's bundles: 143, the stage kept, nothing reserved."""
    address, env, _ = cluster
    big = stage("sft", data=DATA, resources={"cpus_per_worker": 2})
    path = write_pipeline(tmp_path, "wait", {"sft": big})
    run = start_run(path, address, env)
    wait_for_file(tmp_path / "runs" / "wait", ".sft.tmp-*", run)
    time.sleep(3)  # past joining: the driver is in the reservation's wait
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 143, out[-2000:] + err[-2000:]
    assert "SIGTERM received" not in err and "PC: @" not in err and "Traceback" not in err
    assert "interrupted: stage 'sft' stopped (no checkpoint yet, so it starts over)" in err
    assert f"`align run {path}` resumes it" in err
    assert list((tmp_path / "runs" / "wait").glob(".sft.failed-*"))
    probe = (
        f"import ray; ray.init(address={address!r}); "
        "print(sorted({g['state'] for g in ray.util.placement_group_table().values()}))"
    )
    held = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert "PENDING" not in held.stdout and "CREATED" not in held.stdout, held.stdout + held.stderr[-2000:]


def test_sigterm_mid_stage_exits_143_and_keeps_the_stage(cluster, tmp_path):
    address, env, nodes = cluster
    path = write_pipeline(tmp_path, "term", {"sft": stage("sft", steps=5000, batch=2, data=DATA, workers=2)})
    run = start_run(path, address, env)
    wait_for_step(tmp_path / "runs" / "term", 1, run)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 143, out[-2000:] + err[-2000:]
    assert "SIGTERM received" not in err and "PC: @" not in err and "Traceback" not in err
    assert "interrupted: stage 'sft' stopped" in err and f"`align run {path}` resumes it" in err
    assert list((tmp_path / "runs" / "term").glob(".sft.failed-*"))
    deadline = time.time() + 30  # the ranks on both nodes end with the driver that owned them
    while stage_workers(nodes) and time.time() < deadline:
        time.sleep(1)
    assert not stage_workers(nodes)


def test_a_run_without_address_joins_the_head_running_here(cluster, tmp_path):
    address, env, _ = cluster
    path = write_pipeline(tmp_path, "beside", {"sft": stage("sft", steps=2, batch=2, data=DATA)})
    plain = {key: value for key, value in env.items() if key != "RAY_ADDRESS"}
    done = align("run", str(path), env=plain)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first = align_lines(done.stdout)[0]
    assert first.startswith("ray: joined the cluster at") and "(already running on this machine)" in first
    assert stage_folder(path, "sft").is_dir()
    assert json.loads((stage_folder(path, "sft") / "align-stage.json").read_text())["status"] == "succeeded"


def test_a_node_lost_mid_stage_is_retried_from_its_checkpoint_on_the_nodes_left(cluster, tmp_path):
    """Two ranks of half a CPU spread over both nodes; the second node is killed mid-stage; the stage is
    retried from its latest checkpoint on the head alone (which holds both bundles), and ends well. A
    fresh second node then joins for the next test."""
    address, env, nodes = cluster
    trl = {"save_strategy": "steps", "save_steps": 10}
    resources = {"cpus_per_worker": 0.5, "strategy": "spread", "wait_s": 120}
    sft = stage("sft", steps=400, batch=2, data=DATA, workers=2, resources=resources, trl=trl)
    path = write_pipeline(tmp_path, "retry", {"sft": sft})
    run = start_run(path, address, env)
    wait_for_step(tmp_path / "runs" / "retry", 20, run)
    os.killpg(nodes[1].pid, signal.SIGKILL)
    out, err = run.communicate(timeout=400)
    assert run.returncode == 0, out[-2000:] + err[-2000:]
    assert "lost a worker" in out and "retry 1 of 2, from the last checkpoint" in out
    record = stage_record(path, "sft")
    assert record["retries"] == 1 and record["resumed_from"] >= 10
    assert len({rank["node_id"] for rank in record["ranks"]}) == 1  # the head's
    stop_node(nodes.pop())
    nodes.append(start_node("--address", address, log=tmp_path / "node.log", env=env))
    wait_for_nodes(address, 2, env)


def test_a_node_lost_mid_stage_fails_in_one_line_when_the_rest_cannot_hold_the_retry(cluster, tmp_path):
    """Last in the module: it stops the second node. The lost worker is retried from the latest checkpoint,
    which needs both nodes again: the reservation waits its `wait_s`, then the stage ends in one line."""
    address, env, nodes = cluster
    sft = stage("sft", steps=5000, batch=2, data=DATA, workers=2, resources={"wait_s": 15})
    path = write_pipeline(tmp_path, "lost", {"sft": sft})
    run = start_run(path, address, env)
    wait_for_step(tmp_path / "runs" / "lost", 1, run)
    os.killpg(nodes[1].pid, signal.SIGKILL)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 2, out[-2000:] + err[-2000:]
    assert "lost a worker" in out and "retry 1 of 2, from the last checkpoint" in out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "could not reserve 2 x {CPU: 1} (pack) in 15 s" in errors[0], err[-2000:]
    assert list((tmp_path / "runs" / "lost").glob(".sft.failed-*"))
