"""What the stages will run on, detected once on the driver: the plan carries it to every worker.

Detection imports torch only where an NVIDIA driver is present: on a CPU machine `align validate` and
`align plan` must not pay torch's import (4 s on 2 cores) to learn there is no GPU.

When the ranks will run on this machine (an embedded Ray), the plan also knows the host they share
(`Host`), and refuses what it could never hold (align/planning/host.py).
"""

from __future__ import annotations

import ctypes.util
import os
from dataclasses import dataclass
from pathlib import Path

from align.errors import AlignError
from align.models.memory import parse_memory

DEFAULT_DEVICE_MEMORY = "80GB"


@dataclass(frozen=True)
class Host:
    """The one machine every rank of an embedded Ray runs on: its RAM, cores and GPUs, which they share."""

    memory: int
    cores: int
    gpus: int = 0


@dataclass(frozen=True)
class Hardware:
    """Accelerator or not, memory per device, and whether it computes in bf16; `host` when the ranks run
    on this machine, None when they run on machines the driver cannot see (a cluster, or GPUs planned from
    a laptop): then nothing here bounds them."""

    accelerator: bool
    device_memory: int
    bf16: bool = False
    host: Host | None = None

    @classmethod
    def detect(
        cls, device_memory: str | None = None, *, planning: bool = False, local: bool = False
    ) -> Hardware:
        """The local machine, with `--device-memory` overriding what is detected.

        When only planning, a device memory given on a machine without GPUs means "plan for GPUs
        of this size" (bf16), so a CPU laptop can plan the 8B run it will submit elsewhere. `local`: the
        ranks will run here (no --address), so the host is this machine, unless its GPUs are only planned
        for. On a CPU the device is the host: `--device-memory` stands for its RAM.
        """
        memory = None
        if device_memory is not None:
            try:
                memory = parse_memory(device_memory)
            except ValueError as err:
                raise AlignError(f"device memory: {err}") from None
        gpu_memory, gpu_bf16, gpu_count = local_gpu()
        real_gpu = gpu_memory is not None
        gpu = real_gpu or (planning and device_memory is not None)
        bf16 = gpu and (gpu_bf16 if real_gpu else True)
        memory = memory or gpu_memory or (parse_memory(DEFAULT_DEVICE_MEMORY) if gpu else host_memory())
        host = None
        if local and gpu == real_gpu:
            host = Host(host_memory() if gpu else memory, os.cpu_count() or 1, gpu_count)
        return cls(accelerator=gpu, device_memory=memory, bf16=bf16, host=host)


def host_memory() -> int:
    """This machine's RAM: where a CPU-only run keeps everything."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def nvidia_driver_present() -> bool:
    """Cheap: a CUDA device can only exist where the driver library or its /proc entry does."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return False
    return Path("/proc/driver/nvidia").exists() or ctypes.util.find_library("cuda") is not None


def local_gpu() -> tuple[int | None, bool, int]:
    """(memory of GPU 0, bf16 support, how many), or (None, False, 0) without a usable CUDA device."""
    if not nvidia_driver_present():
        return None, False, 0
    import torch

    if not torch.cuda.is_available():
        return None, False, 0
    properties = torch.cuda.get_device_properties(0)
    return properties.total_memory, torch.cuda.is_bf16_supported(), torch.cuda.device_count()
