import dataclasses
import math

import pytest

from diffquant import ModelConfig, build_model, num_params
from diffquant.config import default_ffn_dim, lambda_init_for_layer


def test_lambda_init_schedule_matches_paper():
    expected = [0.8 - 0.6 * math.exp(-0.3 * layer) for layer in range(3)]
    assert [lambda_init_for_layer(i) for i in range(3)] == pytest.approx(expected, abs=0)
    assert lambda_init_for_layer(0) == pytest.approx(0.2, abs=1e-15)
    assert lambda_init_for_layer(1) == pytest.approx(0.35550907, abs=1e-8)
    assert lambda_init_for_layer(2) == pytest.approx(0.47071302, abs=1e-8)


@pytest.mark.parametrize("preset", ["tiny", "small", "base", "xs", "s"])
def test_matched_pairs_have_equal_projection_shapes_and_close_parameter_counts(preset):
    tr = ModelConfig.preset(preset, arch="transformer")
    diff = ModelConfig.preset(preset, arch="diff")
    assert diff == tr.matched("diff") and diff.matched("transformer") == tr
    assert dataclasses.replace(diff, lambda_init=0.8).matched("transformer") == tr  # the λ ablation's partner
    assert diff.n_heads * 2 == tr.n_heads and diff.head_dim == tr.head_dim
    assert (diff.q_dim, diff.kv_dim) == (tr.q_dim, tr.kv_dim)
    if preset == "base":  # too big to build in a unit test; the shapes above decide the count
        return
    n_tr, n_diff = num_params(build_model(tr)), num_params(build_model(diff))
    extra_per_layer = 4 * tr.head_dim + 2 * tr.head_dim  # λ vectors + subln weight
    assert n_diff - n_tr == tr.n_layers * extra_per_layer
    assert abs(n_diff - n_tr) / n_tr < 0.005


def test_small_preset_size_is_in_the_cpu_budget():
    n = num_params(build_model(ModelConfig.preset("small", arch="diff")))
    assert 3e6 <= n <= 6e6


def test_xs_is_the_stories260k_shape_and_s_reaches_the_papers_lambda_range():
    from diffquant.checkpoint.gguf import load_gguf, stories260k_path

    xs = ModelConfig.preset("xs")
    real = load_gguf(stories260k_path()).config
    same = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "norm_eps", "rope_theta")
    assert all(getattr(xs, f) == getattr(real, f) for f in same) and xs.max_seq_len == 512
    assert 255_000 < num_params(build_model(xs)) < 265_000  # stories260K ties its head (llama2.c)
    s = ModelConfig.preset("s", arch="diff")
    assert (s.d_model, s.n_layers, s.head_dim, s.vocab_size) == (128, 8, 16, 512)
    assert s.lambda_init_at(7) == pytest.approx(0.73, abs=0.01)


def test_constant_lambda_init_is_a_config_field(tmp_path):
    cfg = ModelConfig.preset("tiny", arch="diff", lambda_init=0.8)
    assert [cfg.lambda_init_at(i) for i in range(2)] == [0.8, 0.8]
    assert [b.attn.lambda_init for b in build_model(cfg).layers] == [0.8, 0.8]
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="lambda_init"):
        ModelConfig.preset("tiny", arch="diff", lambda_init=float("nan"))


def test_default_ffn_dim_is_eight_thirds_rounded_to_64():
    assert default_ffn_dim(256) == 704 and default_ffn_dim(768) == 2048 and default_ffn_dim(64) == 192


def test_json_round_trip(tmp_path):
    cfg = ModelConfig.preset("small", arch="diff", n_kv_heads=2, attn_impl="sdpa")
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    cfg.to_json(tmp_path / "c.json")
    assert ModelConfig.from_json(tmp_path / "c.json") == cfg


@pytest.mark.parametrize("bad, message", [
    (dict(arch="mamba"), "unknown arch"),
    (dict(attn_impl="xformers"), "unknown attn_impl"),
    (dict(d_model=30, n_heads=4), "not divisible"),
    (dict(n_layers=0), "positive"),
    (dict(vocab_size=-5), "positive"),
    (dict(n_heads=4, n_kv_heads=3), "multiple of n_kv_heads"),
    (dict(d_model=36, n_heads=4, arch="diff"), "not divisible"),
    (dict(d_model=20, n_heads=4), "even for RoPE"),
])
def test_invalid_configs_raise_one_line_value_errors(bad, message):
    with pytest.raises(ValueError, match=message) as info:
        ModelConfig(**bad)
    assert "\n" not in str(info.value)


def test_odd_head_count_has_no_diff_partner():
    with pytest.raises(ValueError, match="even number of heads"):
        ModelConfig(d_model=48, n_heads=3).matched("diff")


def test_unknown_preset_and_unknown_json_field():
    with pytest.raises(ValueError, match="unknown preset"):
        ModelConfig.preset("huge")
    data = dataclasses.asdict(ModelConfig())
    data["n_expert"] = 8
    with pytest.raises(ValueError, match="unknown config fields: n_expert"):
        ModelConfig.from_dict(data)


def test_sizes_are_always_concrete_and_old_configs_with_nulls_load():
    for name in ("tiny", "small", "xs", "s"):
        for arch in ("transformer", "diff", "gated", "clipped"):
            cfg = ModelConfig.preset(name, arch=arch)
            assert all(isinstance(getattr(cfg, f), int) for f in ("head_dim", "n_kv_heads", "ffn_dim"))
    old = {"arch": "diff", "vocab_size": 100, "d_model": 64, "n_layers": 2, "n_heads": 2, "n_kv_heads": None,
           "head_dim": None, "ffn_dim": None}
    cfg = ModelConfig.from_dict(old)
    assert (cfg.head_dim, cfg.n_kv_heads, cfg.ffn_dim) == (16, 2, default_ffn_dim(64))
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
