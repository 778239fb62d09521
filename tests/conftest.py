"""Shared test settings: no hub, a private cache for builtins, GPU tests skipped without GPUs."""

import os
import tempfile

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA devices; without them they skip with the reason, never fail."""
    import torch

    count = torch.cuda.device_count()
    for item in items:
        marker = item.get_closest_marker("gpu")
        needed = marker.kwargs.get("devices", 1) if marker else 0
        if marker and count < needed:
            item.add_marker(pytest.mark.skip(reason=f"needs {needed} CUDA device(s), found {count}"))


# Builtin models and data are built once per test session into a private cache (about 2 s).
os.environ.setdefault("ALIGN_CACHE", tempfile.mkdtemp(prefix="align-test-cache-"))
