"""The warm worker group's own logic, without Ray: each rank's environment from where its actor landed, and
what a worker undoes between stages. The group itself runs in every `align run` test; a stage on a warm
worker equal to one on fresh workers is tests/test_pipeline_e2e.py's."""

from __future__ import annotations

import os
import threading
import time

import pytest

from align.backends import BACKENDS
from align.run import stop
from align.run.reservation import Turns
from align.run.workers import rank_environments, reset_process

MASTER = ("10.0.0.1", 29500)


def test_ranks_on_one_node_share_its_gpus_and_each_takes_its_own() -> None:
    envs = rank_environments([("10.0.0.1", ["3"]), ("10.0.0.1", ["1"])], MASTER, gpu=True)
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["1,3", "1,3"]  # NCCL sees its peer
    assert [env["LOCAL_RANK"] for env in envs] == ["0", "1"]
    assert [env["ACCELERATE_TORCH_DEVICE"] for env in envs] == ["cuda:0", "cuda:1"]
    assert {env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] for env in envs} == {"1"}  # a hung collective fails


def test_ranks_on_two_nodes_number_nodes_and_local_ranks_apart() -> None:
    places = [("10.0.0.1", ["0"]), ("10.0.0.2", ["0"]), ("10.0.0.1", ["1"]), ("10.0.0.2", ["1"])]
    envs = rank_environments(places, MASTER, gpu=True)
    assert [env["RANK"] for env in envs] == ["0", "1", "2", "3"]
    assert [env["NODE_RANK"] for env in envs] == ["0", "1", "0", "1"]
    assert [env["LOCAL_RANK"] for env in envs] == ["0", "0", "1", "1"]
    assert {env["WORLD_SIZE"] for env in envs} == {"4"} and {env["LOCAL_WORLD_SIZE"] for env in envs} == {"2"}
    assert {(env["MASTER_ADDR"], env["MASTER_PORT"]) for env in envs} == {("10.0.0.1", "29500")}


def test_cpu_ranks_name_no_gpu() -> None:
    envs = rank_environments([("127.0.0.1", []), ("127.0.0.1", [])], MASTER, gpu=False)
    assert all("CUDA_VISIBLE_DEVICES" not in env for env in envs)
    assert {env["ACCELERATE_TORCH_DEVICE"] for env in envs} == {"cpu"}


def test_a_rank_without_a_process_group_gets_no_distributed_environment() -> None:
    """Accelerate reads LOCAL_RANK as a distributed run and wraps the model in DDP, even one CPU rank's."""
    [env] = rank_environments([("127.0.0.1", [])], MASTER, gpu=False, process_group=False)
    assert env == {"ACCELERATE_TORCH_DEVICE": "cpu"}
    [env] = rank_environments([("127.0.0.1", ["0"])], MASTER, gpu=True, process_group=False)
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR"} & set(env)
    assert (env["CUDA_VISIBLE_DEVICES"], env["ACCELERATE_TORCH_DEVICE"]) == ("0", "cuda:0")


@pytest.mark.parametrize(
    ("backend", "workers", "joins"),
    [("ddp", 1, False), ("ddp", 2, True), ("zero2", 1, True), ("fsdp", 1, True)],
)
def test_only_the_backends_that_need_a_process_group_join_one(backend, workers, joins) -> None:
    """One DDP rank has nothing to synchronize; DeepSpeed's engine and FSDP's mesh need one at any size."""
    assert BACKENDS[backend].needs_process_group(workers) is joins


def test_a_worker_forgets_a_stage_s_accelerate_state_and_environment(monkeypatch) -> None:
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    monkeypatch.delenv("HF_TOKEN", raising=False)
    before = dict(os.environ)
    Accelerator(mixed_precision="no")
    os.environ["HF_TOKEN"] = "from the stage's trl block"
    reset_process(before)
    assert "HF_TOKEN" not in os.environ
    assert not AcceleratorState._shared_state  # the next stage may choose another precision
    Accelerator(mixed_precision="bf16")  # refused without the reset: "already initialized"
    reset_process(before)


def test_reservations_take_turns_in_the_pipelines_order() -> None:
    """A small stage queued after a big one does not reserve first, though its thread asks first."""
    stop.clear()
    turns = Turns(["big", "small"])
    turns.queue("big")
    turns.queue("small")
    order: list[str] = []

    def small() -> None:
        with turns.turn("small"):
            order.append("small")

    asking = threading.Thread(target=small)
    asking.start()
    time.sleep(0.3)
    assert order == []  # it waits for "big", queued before it in the pipeline's order
    with turns.turn("big"):
        order.append("big")
    asking.join(timeout=5)
    assert order == ["big", "small"]
