"""One seed makes a run bit-identical on CPU, whatever state the process's RNG starts in (torch 2.13 starts
each process with a random seed); another seed gives another run. LoRA DPO, in this process, no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from align.planning.hardware import Hardware
from tests.pipelines import run_in_process

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)


def lora_dpo_adapter(folder: Path, seed: int, process_rng: int) -> dict[str, torch.Tensor]:
    """Three steps of LoRA DPO from a process whose RNG was left at `process_rng`; the trained adapter."""
    body = {
        "name": "seeded",
        "base_model": "tiny",
        "defaults": {"output_root": str(folder), "precision": "fp32", "seed": seed, "backend": "ddp"},
        "stages": {
            "dpo": {
                "kind": "dpo",
                "data": {"train": "align:chatterbot/prefs/train", "eval": "none", "max_train_rows": 48},
                "lora": {"r": 4, "dropout": 0.1},
                "trl": {
                    "max_steps": 3,
                    "per_device_train_batch_size": 4,
                    "learning_rate": 1e-3,
                    "max_length": 48,
                    "save_strategy": "no",
                    "report_to": "none",
                },
            }
        },
    }
    folder.mkdir()
    path = folder / "seeded.yaml"
    path.write_text(yaml.safe_dump(body))
    torch.manual_seed(process_rng)
    run_in_process(path, "dpo", folder / "out", CPU)
    return load_file(folder / "out" / "adapter" / "adapter_model.safetensors")


@pytest.mark.integration
def test_a_seed_makes_lora_dpo_bit_identical_and_another_seed_differs(tmp_path: Path) -> None:
    first = lora_dpo_adapter(tmp_path / "a", seed=0, process_rng=1)
    again = lora_dpo_adapter(tmp_path / "b", seed=0, process_rng=2)
    other = lora_dpo_adapter(tmp_path / "c", seed=1, process_rng=1)
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not all(torch.equal(first[name], other[name]) for name in first)
