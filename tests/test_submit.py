"""`align submit` against a real Ray head on loopback: the job runs the pipeline and succeeds."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.pipelines import stage, stage_record, write_pipeline

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cli(*args: str, env: dict, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "align.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=cwd,
    )


def wait_for_jobs_api(address: str, head: subprocess.Popen, timeout: float = 180) -> None:
    """Poll the dashboard until the Jobs API answers (the head takes ~10-20 s on 2 cores)."""
    import urllib.error
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        assert head.poll() is None, head.stdout.read() if head.stdout else "ray start exited"
        try:
            with urllib.request.urlopen(f"{address}/api/version", timeout=2):
                return
        except urllib.error.HTTPError:  # it answers (401 until the client sends Ray's auth token)
            return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"the Ray head at {address} did not answer in {timeout:.0f} s")


@pytest.fixture
def ray_head():
    """A Ray head of its own (`ray start --head --block`) on 127.0.0.1 with the Jobs API, ended afterwards.

    `--block` keeps it in the foreground so that it can be stopped alone: `ray stop` would end every
    Ray instance on the machine. Its temp dir is short: Unix socket paths are limited to 107 bytes.
    """
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    # Ray 2.60 heads require a token by default; clients send it only in token mode
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RAY_AUTH_MODE": "token"}
    dashboard = free_port()
    # every port of its own: a second Ray on the machine (another test, a user's) must not collide
    names = (
        "port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "metrics-export-port",
        "runtime-env-agent-port",
        "ray-client-server-port",
        "node-manager-port",
        "object-manager-port",
    )
    start = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
        "--num-cpus=2",
        "--disable-usage-stats",
        f"--temp-dir={temp}",
        *(f"--{name}={free_port()}" for name in names),
    ]
    head = subprocess.Popen(
        start, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        wait_for_jobs_api(address, head)
        yield address, env
    finally:
        head.terminate()
        try:
            head.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a slow graceful stop: end the head and its Ray processes
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_a_submission_from_outside_the_project_carries_its_data(tmp_path, ray_head):
    """Submitted from a folder of the user's own, with the data beside the pipeline file (a relative path):
    the file travels with the job, the job runs it on the cluster and writes under the output root."""
    address, env = ray_head
    (tmp_path / "rows.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": f"Say {n}."},
                        {"role": "assistant", "content": f"{n}."},
                    ]
                }
            )
            + "\n"
            for n in range(64)
        )
    )
    sft = stage("sft", steps=3, data={"train": "rows.jsonl"})
    path = write_pipeline(tmp_path, "submitted", {"sft": sft})
    submitted = cli("submit", path.name, "--address", address, env=env, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    assert "sent with the job: submitted.yaml" in submitted.stdout
    assert "-rows.jsonl" in submitted.stdout and "defaults.output_root" in submitted.stdout
    job_id = submitted.stdout.strip().splitlines()[-1]

    deadline = time.time() + 600
    status = ""
    while time.time() < deadline and status not in ("SUCCEEDED", "FAILED", "STOPPED"):
        time.sleep(3)
        status = cli("status", job_id, "--address", address, env=env, cwd=tmp_path).stdout.strip()
    logs = cli("logs", job_id, "--address", address, env=env, cwd=tmp_path).stdout
    assert status == "SUCCEEDED", logs[-4000:]
    assert "[sft] done" in logs
    record = stage_record(path, "sft")
    assert record["status"] == "succeeded"
    assert record["config"]["data"]["train"].endswith("-rows.jsonl")  # the packed copy the job read


def test_submit_refuses_a_broken_file_before_reaching_the_cluster(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nbase_model: tiny\nstages:\n  sft: {kind: sft}\n")
    done = cli("submit", str(broken), "--address", "http://127.0.0.1:9", env=dict(os.environ))
    assert done.returncode == 2
    assert "stages.sft.data" in done.stderr and "Traceback" not in done.stderr
