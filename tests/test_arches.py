"""The arch table: every reader takes its arches from diffquant/arches.py, so a new arch is one row."""

import dataclasses

import pytest
import torch

from diffquant import ModelConfig, build_model
from diffquant.arches import ARCHES, Arch, arch_spec, register_arch, unregister_arch
from diffquant.config import ARCHS
from tests.conftest import tiny_config


@pytest.fixture
def dummy():
    """One row, added in one place: the gated attention with its own matching rule (32 FFN units fewer)."""
    row = register_arch(Arch("dummy", "Dummy", "Y", "tab:olive", (0, (1, 1)), gated=True,
                             to_transformer=lambda c: {"ffn_dim": c.ffn_dim + 32},
                             from_transformer=lambda c: {"ffn_dim": c.ffn_dim - 32}))
    yield row
    unregister_arch("dummy")


def test_the_built_in_rows():
    assert ARCHS == ("transformer", "diff", "gated", "clipped") == tuple(ARCHES)
    assert arch_spec("diff").sub_heads == 2 and not arch_spec("clipped").fused
    with pytest.raises(ValueError, match="unknown arch 'nope'"):
        arch_spec("nope")


def test_a_dummy_arch_touches_one_place(dummy):
    from diffquant import config, plots, report, tables
    from diffquant.study.pair import ARCH_SHORT

    cfg = tiny_config("transformer").matched("dummy")
    assert cfg.arch == "dummy" and cfg.ffn_dim == tiny_config("transformer").ffn_dim - 32
    assert cfg.matched("transformer") == tiny_config("transformer")
    assert cfg.matched("diff") == tiny_config("diff")
    assert "dummy" in config.ARCHS and ModelConfig.from_json(cfg.to_json()) == cfg
    model = build_model(cfg)
    assert model.layers[0].attn.is_gated and not model.layers[0].attn.is_diff
    logits = model(torch.randint(0, cfg.vocab_size, (2, 9)))
    assert logits.shape == (2, 9, cfg.vocab_size) and torch.isfinite(logits).all()
    assert report.ARCH_NAMES["dummy"] == "Dummy" and plots.ARCH_COLORS["dummy"] == "tab:olive"
    assert plots.LINESTYLES["dummy"] == (0, (1, 1)) and ARCH_SHORT["dummy"] == "Y"
    assert report._family("stories-dummy-s0") == "stories--s0"
    assert dict(tables.SITE_NAMES)["attn_gate"] == "attention gate"
    with pytest.raises(ValueError, match="already registered"):
        register_arch(dataclasses.replace(dummy))


def test_an_unknown_arch_is_refused():
    with pytest.raises(ValueError, match="unknown arch 'dummy'"):
        ModelConfig(arch="dummy")
