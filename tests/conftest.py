"""Shared test settings: no hub, a private cache for builtins, GPU tests skipped without GPUs."""

import os
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


SLOW_SUITES = {
    "test_equivalence",
    "test_zero2",
    "test_fsdp",
    "test_ppo",
    "test_submit",
    "test_models",
    "test_kto",
    "test_seeding",
    "test_data_formats",
    "test_data_shapes_train",
    "test_families",
    "test_chat_templates",
    "test_data_cache",
    "test_eval_stage",
    "test_distill",
    "test_lm_head",
    "test_rl_signal",
}
"""The 2-rank backend suites (each a multi-stage Ray run of 1.5 to 3 minutes on 2 cores), the Ray Jobs
submit test, the smollm2 conversion, the KTO pipeline, the three seeded DPO runs, the stage per data
format, the distillation runs, the chat-template LM-head runs and the RL runs whose reward never fires:
their integration tests are `slow`, outside `make test` and run by `make test-slow` (CI runs both).
Their unit tests stay in `make test`."""


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA devices; without them they skip with the reason, never fail. The integration
    tests of SLOW_SUITES are marked `slow`."""
    import torch

    count = torch.cuda.device_count()
    for item in items:
        if item.get_closest_marker("integration") and item.module.__name__.split(".")[-1] in SLOW_SUITES:
            item.add_marker(pytest.mark.slow)
        marker = item.get_closest_marker("gpu")
        needed = marker.kwargs.get("devices", 1) if marker else 0
        if marker and count < needed:
            item.add_marker(pytest.mark.skip(reason=f"needs {needed} CUDA device(s), found {count}"))


# Builtin models and data are built once per test session into a private cache (about 2 s).
os.environ.setdefault("ALIGN_CACHE", tempfile.mkdtemp(prefix="align-test-cache-"))
