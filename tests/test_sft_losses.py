"""The SFT runner in this process (no Ray): its first six fp32 losses on the tiny model are pinned, as
torchtune pins its recipes, so any change to what a stage computes shows up here first."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from align.planning.hardware import Hardware
from tests.pipelines import logged_losses, run_in_process

# assistant turns only (the default for conversations since issue 34), at a max_length that keeps them
PINNED = [7.636019, 7.589466, 7.557526, 7.468298, 7.494131, 7.423284]
CPU = Hardware(accelerator=False, device_memory=80 * 10**9)


def sft_losses(folder: Path) -> list[float]:
    """Six logged steps of full-parameter SFT: batch 8, lr 1e-3, fp32, seed 0, one process."""
    body = {
        "name": "pinned",
        "base_model": "tiny",
        "defaults": {"output_root": str(folder), "precision": "fp32", "seed": 0, "backend": "ddp"},
        "stages": {
            "sft": {
                "kind": "sft",
                "data": {"train": "align:chatterbot/sft/train", "eval": "none", "max_train_rows": 64},
                "trl": {
                    "max_steps": 6,
                    "logging_steps": 1,
                    "per_device_train_batch_size": 8,
                    "learning_rate": 1e-3,
                    "max_length": 128,  # keeps every answer whole (64 cuts 8 of them: the stage stops)
                    "save_strategy": "no",
                    "report_to": "none",
                },
            }
        },
    }
    path = folder / "pinned.yaml"
    path.write_text(yaml.safe_dump(body))
    run_in_process(path, "sft", folder / "out", CPU)
    return logged_losses(folder / "out")


@pytest.mark.integration
def test_the_first_six_fp32_sft_losses_are_pinned(tmp_path: Path) -> None:
    losses = sft_losses(tmp_path)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(PINNED), rtol=1e-4, atol=1e-4)
