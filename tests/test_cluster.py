"""A real multi-node Ray on loopback: two `ray start` nodes of one CPU each (token auth off), started and
stopped by their own process groups, never `ray stop`. Stages reserve one bundle per rank all at once:
a 2-rank stage spreads over both nodes, a 1-rank stage after it runs (it once asked for the cluster's
total and waited forever), a request no node holds fails within its `wait_s`, SIGTERM stops a run as
Ctrl-C does, a run with no `--address` joins the head running on this machine, and a node lost mid-stage
ends the stage in one line when the rest cannot hold its retry. `make test-cluster`."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipelines import SFT_DATA, stage, stage_folder, stage_record, write_pipeline

pytestmark = pytest.mark.cluster

BIN = Path(sys.executable).parent
POINTER = Path(os.environ.get("RAY_TMPDIR") or "/tmp") / "ray" / "ray_current_cluster"
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
    """(address, env, nodes): a head and one more node on loopback, one CPU each, stopped afterwards."""
    folder = tmp_path_factory.mktemp("cluster")
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
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
            try:
                os.killpg(node.pid, signal.SIGTERM)
                node.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(node.pid, signal.SIGKILL)
        if POINTER.is_file() and POINTER.read_text().strip().endswith(f":{port}"):
            POINTER.unlink()  # the pointer our head left: a later Ray must not try to join it


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


def nodes_of(path: Path, name: str) -> list[str]:
    return [rank["node_id"] for rank in stage_record(path, name)["ranks"]]


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
        "{CPU: 1}: lower `resources:` or `workers:`, or add nodes (`ray status`)"
    ]
    assert "Traceback" not in done.stderr


def test_sigterm_mid_stage_exits_143_and_keeps_the_stage(cluster, tmp_path):
    address, env, _ = cluster
    path = write_pipeline(tmp_path, "term", {"sft": stage("sft", steps=5000, batch=2, data=DATA, workers=2)})
    run = subprocess.Popen(
        [sys.executable, "-m", "align.cli", "run", str(path), "--address", address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline and not list(
        (tmp_path / "runs" / "term").glob(".sft.tmp-*/logs/progress.json")
    ):
        time.sleep(1)
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 143, out[-2000:] + err[-2000:]
    assert "SIGTERM received" not in err and "PC: @" not in err
    assert "`align run" in err and "resumes it" in err
    assert list((tmp_path / "runs" / "term").glob(".sft.failed-*"))


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


def test_a_node_lost_mid_stage_fails_in_one_line_when_the_rest_cannot_hold_the_retry(cluster, tmp_path):
    """Last in the module: it stops the second node. The lost worker is retried from the latest checkpoint,
    which needs both nodes again: the reservation waits its `wait_s`, then the stage ends in one line."""
    address, env, nodes = cluster
    sft = stage("sft", steps=5000, batch=2, data=DATA, workers=2, resources={"wait_s": 15})
    path = write_pipeline(tmp_path, "lost", {"sft": sft})
    run = subprocess.Popen(
        [sys.executable, "-m", "align.cli", "run", str(path), "--address", address],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while time.time() < deadline and not list(
        (tmp_path / "runs" / "lost").glob(".sft.tmp-*/logs/progress.json")
    ):
        time.sleep(1)
    os.killpg(nodes[1].pid, signal.SIGKILL)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 2, out[-2000:] + err[-2000:]
    assert "lost a worker" in out and "retry 1 of 2, from the last checkpoint" in out
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "could not reserve 2 x {CPU: 1} (pack) in 15 s" in errors[0], err[-2000:]
    assert list((tmp_path / "runs" / "lost").glob(".sft.failed-*"))
