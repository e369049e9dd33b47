"""Shared test set-up: every test is seeded, runs single-threaded, and gets tiny configs."""

import pytest
import torch

from diffquant import ModelConfig

torch.set_num_threads(1)  # tiny tensors: one thread avoids pool overhead and oversubscription


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def tiny_config(arch: str = "transformer", **overrides) -> ModelConfig:
    """HF-style tiny model: vocab ~100, d 32, 2 layers."""
    base = dict(vocab_size=101, d_model=32, n_layers=2, n_heads=4, max_seq_len=64)
    base.update(overrides)
    cfg = ModelConfig(arch="transformer", **base)
    return cfg.matched(arch)


@pytest.fixture(params=["transformer", "diff"])
def arch(request):
    return request.param


@pytest.fixture
def tiny(arch):
    return tiny_config(arch)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
