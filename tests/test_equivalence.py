"""One global batch, one seed, fp32: the loss trajectory must not depend on the backend.

A single process with batch 8 is the reference; ddp, zero2 and fsdp each run 2 ranks of batch 4.
Any difference beyond float noise means a backend changed the maths (wrong loss scaling, a
missed gradient reduction, a rank that saw other data).
"""

import pytest

from tests.pipelines import SFT_DATA, losses, run, stage, write_pipeline

pytestmark = pytest.mark.integration

STEPS = 6
CASES = {  # label: (backend, workers, per-rank batch)
    "single": ("ddp", 1, 8),
    "ddp": ("ddp", 2, 4),
    "zero2": ("zero2", 2, 4),
    "fsdp": ("fsdp", 2, 4),
}


def test_single_ddp_zero2_and_fsdp_losses_agree(tmp_path):
    stages = {}
    for label, (backend, workers, batch) in CASES.items():
        sft = stage("sft", steps=STEPS, batch=batch, trl={"lr_scheduler_type": "constant"})
        sft.update(backend=backend, workers=workers, data={"train": SFT_DATA["train"], "max_train_rows": 256})
        stages[label] = sft
    path = write_pipeline(tmp_path, "equivalence", stages, precision="fp32", seed=0)
    run(path)  # one `align run`: the four stages in turn, each under its own backend
    reference = losses(path, "single")
    assert len(reference) == STEPS
    assert reference[-1] < reference[0]  # it trains, so agreement is not agreement on a constant
    for label in ("ddp", "zero2", "fsdp"):
        found = losses(path, label)
        assert len(found) == STEPS
        worst = max(abs(a - b) for a, b in zip(reference, found, strict=True))
        assert worst <= 1e-3, f"{label} drifts from the single process by {worst:.2e}: {found} vs {reference}"
