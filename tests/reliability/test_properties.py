"""Property-based fuzzing of configs, config text and CLI numbers: a valid value or our one-line error, never
another exception, never a file read on the text's say-so."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffquant import ModelConfig
from diffquant.cli import main
from diffquant.cliargs import UPPER, bounded_int, finite_float
from diffquant.quant import QuantConfig

FIELDS = ("arch", "vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffn_dim",
          "max_seq_len", "rope_theta", "norm_eps", "tie_embeddings", "attn_impl")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)
small_ints = st.integers(-3, 300)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _one_line_value_error(make) -> None:
    try:
        make()
    except ValueError as exc:
        assert "\n" not in str(exc) and str(exc)


@FAST
@given(st.dictionaries(st.sampled_from(FIELDS), json_values | small_ints, max_size=6))
def test_any_config_dict_is_a_config_or_a_one_line_value_error(data):
    _one_line_value_error(lambda: _valid(ModelConfig.from_dict(data)))


QUANT_KEYS = ("method", "bits", "group_size", "symmetric", "act_order", "damp", "threshold", "embeddings",
              "granularity")


@FAST
@given(st.sampled_from(["weights", "logits", "activations", "hidden"]),
       st.dictionaries(st.sampled_from(QUANT_KEYS), json_values | small_ints | st.sampled_from(["rtn", "gptq",
                                                                                             "token", "tensor"]),
                       max_size=5))
def test_any_quant_config_dict_is_a_config_or_a_one_line_value_error(part, data):
    _one_line_value_error(lambda: QuantConfig.from_dict({part: data}))


def _valid(cfg: ModelConfig) -> None:
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "max_seq_len"):
        value = getattr(cfg, name)
        assert type(value) is int and value > 0
    assert type(cfg.tie_embeddings) is bool
    assert math.isfinite(cfg.rope_theta) and math.isfinite(cfg.norm_eps) and cfg.norm_eps > 0


@FAST
@given(st.text(max_size=40))
def test_config_text_is_parsed_never_followed(tmp_path_factory, text):
    """Whatever the text, it is parsed: a path in it (even to a valid config file) is never opened."""
    target = tmp_path_factory.getbasetemp() / "real-config.json"
    target.write_text(ModelConfig().to_json())
    for candidate in (text, str(target), f"  {target}"):
        for parse in (ModelConfig.from_json_text, ModelConfig.from_json):
            try:
                parse(candidate)
            except ValueError as exc:
                assert "\n" not in str(exc)
            else:
                assert candidate.lstrip().startswith("{")  # only a JSON object makes a config


def test_from_json_reads_a_path_object_given_explicitly(tmp_path):
    file = tmp_path / "c.json"
    file.write_text(ModelConfig(n_layers=3).to_json())
    assert ModelConfig.from_json(file).n_layers == 3 and ModelConfig.from_json_file(str(file)).n_layers == 3
    assert QuantConfig.from_json(QuantConfig().to_json()) == QuantConfig()
    with pytest.raises(ValueError):
        QuantConfig.from_json(str(file))  # a str is text, not a path


@FAST
@given(st.sampled_from(["tokens", "seed", "n_boot", "batch_size"]), st.integers(-2**40, 2**40))
def test_integer_options_accept_exactly_their_range(dest, value):
    import argparse

    low, high = (0 if dest == "seed" else 1), UPPER.get(dest, 2**31 - 1)
    try:
        assert bounded_int(dest)(str(value)) == value and low <= value <= high
    except argparse.ArgumentTypeError:
        assert not low <= value <= high


@FAST
@given(st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6))
def test_float_options_are_finite_non_negative(value):
    import argparse

    try:
        parsed = finite_float(str(value))
        assert math.isfinite(parsed) and parsed >= 0
    except argparse.ArgumentTypeError:
        pass


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flag=st.sampled_from(["--tokens", "--seq-len", "--chunk", "--batch-size", "--topk"]),
       value=st.integers(-10**6, 0) | st.sampled_from(["nan", "1e9999", "", "0x10", "1.5"]))
def test_bad_profile_numbers_exit_2_in_one_line(assets, capsys, flag, value):
    capsys.readouterr()
    assert main(["profile", str(assets["ckpt"]), flag, str(value)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err


def test_config_json_round_trip_stays_standard_json():
    text = ModelConfig.preset("tiny", arch="diff").to_json()
    assert ModelConfig.from_json_text(text) == ModelConfig.preset("tiny", arch="diff")
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard constant {c}"))


def test_zero_is_accepted_exactly_where_it_is_the_default():
    """``--every 0`` (0 = off, the default) is fine; ``--count 0`` is not; floats must be finite."""
    from diffquant.cli import OneLineParser
    from diffquant.cliargs import check_numbers

    parser = OneLineParser(prog="x")
    parser.add_argument("--every", type=int, default=0)
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--rate", type=float, default=0.1)
    check_numbers(parser)
    assert parser.parse_args(["--every", "0", "--count", "1", "--rate", "0"]).every == 0
    for bad in (["--count", "0"], ["--every", "-1"], ["--rate", "inf"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
