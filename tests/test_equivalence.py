"""One global batch, one seed: the loss trajectory must not depend on the backend.

A single process with batch 8 is the reference; ddp, zero2 and fsdp each run 2 ranks of batch 4, in fp32
and in bf16 mixed precision. Any difference beyond float noise means a backend changed the maths (wrong
loss scaling, a missed gradient reduction, a rank that saw other data, weights not kept in fp32).

Tolerances, from the measured worst |Δloss| over 6 steps (2 CPU ranks, gloo, seed 0):
- fp32: 9.5e-7 for every backend (the order of additions in the gradient all-reduce); allowed 1e-5.
- bf16: ddp 1.1e-4, fsdp 5.8e-4, zero2 1.25e-3. Each rank's forward rounds its activations to bf16
  (8 bits of mantissa: a relative step of 3.9e-3, about 0.03 at a loss of 7.5), and only the sums
  taken over other rows differ between one process and two; ZeRO-2 also reduces bf16 gradients where
  ddp and fsdp reduce fp32 ones. Allowed 2.5e-3: twice the worst, a tenth of one bf16 step of the loss.
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
TOLERANCE = {"fp32": 1e-5, "bf16": 2.5e-3}


@pytest.fixture(scope="module")
def equivalence_run(tmp_path_factory):
    """One `align run`: the four cases in each precision, each stage under its own backend."""
    stages = {}
    for precision in TOLERANCE:
        for label, (backend, workers, batch) in CASES.items():
            sft = stage("sft", steps=STEPS, batch=batch, trl={"lr_scheduler_type": "constant"})
            data = {"train": SFT_DATA["train"], "max_train_rows": 256}
            sft.update(backend=backend, workers=workers, precision=precision, data=data)
            stages[f"{label}_{precision}"] = sft
    path = write_pipeline(tmp_path_factory.mktemp("equivalence"), "equivalence", stages, seed=0)
    run(path, timeout=1800)
    return path


@pytest.mark.parametrize("precision", TOLERANCE)
def test_single_ddp_zero2_and_fsdp_losses_agree(equivalence_run, precision):
    reference = losses(equivalence_run, f"single_{precision}")
    assert len(reference) == STEPS
    assert reference[-1] < reference[0]  # it trains, so agreement is not agreement on a constant
    for label in ("ddp", "zero2", "fsdp"):
        found = losses(equivalence_run, f"{label}_{precision}")
        assert len(found) == STEPS
        worst = max(abs(a - b) for a, b in zip(reference, found, strict=True))
        assert worst <= TOLERANCE[precision], (
            f"{label} {precision} drifts by {worst:.2e}: {found} vs {reference}"
        )


def test_bf16_trains_differently_from_fp32(equivalence_run):
    """The bf16 runs computed in bf16: otherwise the tolerance above would be testing fp32 twice."""
    assert losses(equivalence_run, "single_bf16") != losses(equivalence_run, "single_fp32")
