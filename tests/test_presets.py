"""The size ladder's presets m and l: sizes, parameter matching within 1 %, λ_init by depth as the paper."""

import math

import pytest
import torch

from diffquant.config import PRESETS, ModelConfig
from diffquant.model import LM, num_params


def built(name: str, arch: str) -> LM:
    with torch.device("meta"):  # shapes only: l has 85M parameters
        return LM(ModelConfig.preset(name, arch=arch))


def counted_by_hand(cfg: ModelConfig) -> int:
    """Tied embedding, final norm, and per layer: q/k/v/o, SwiGLU, two norms; Diff adds four λ vectors and
    the sub-layer norm of its 2·head_dim values."""
    d = cfg.d_model
    layer = d * cfg.q_dim * 2 + d * cfg.kv_dim * 2 + 3 * d * cfg.ffn_dim + 2 * d
    if cfg.arch == "diff":
        layer += 4 * cfg.head_dim + 2 * cfg.head_dim
    return cfg.vocab_size * d + d + cfg.n_layers * layer


@pytest.mark.parametrize("name, low, high", [("m", 10e6, 20e6), ("l", 50e6, 100e6)])
def test_ladder_sizes_vocabulary_and_context(name, low, high):
    assert PRESETS[name]["vocab_size"] == 512 and PRESETS[name]["max_seq_len"] == 512  # stories260K's
    for arch in ("transformer", "diff"):
        model = built(name, arch)
        assert num_params(model) == counted_by_hand(model.config)
        assert low <= num_params(model) <= high


@pytest.mark.parametrize("name", ["xs", "s", "m", "l"])
def test_ladder_pairs_are_matched_within_one_percent(name):
    t, d = built(name, "transformer"), built(name, "diff")
    assert abs(num_params(d) / num_params(t) - 1) < 0.01
    assert d.config.n_heads * 2 == t.config.n_heads and d.config.head_dim == t.config.head_dim
    assert d.config.q_dim == t.config.q_dim


@pytest.mark.parametrize("name", ["m", "l"])
def test_diff_lambda_init_follows_depth_as_the_paper(name):
    model = built(name, "diff")
    assert model.config.lambda_init is None  # no constant: the schedule
    for layer, block in enumerate(model.layers):
        assert block.attn.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * layer), abs=1e-12)
    assert model.layers[-1].attn.lambda_init > 0.7


def test_ladder_grows_monotonically():
    sizes = [num_params(built(name, "transformer")) for name in ("xs", "s", "m", "l")]
    assert sizes == sorted(sizes) and sizes[-1] / sizes[0] > 100
