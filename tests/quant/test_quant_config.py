"""QuantConfig / WeightQuant / ActQuant: JSON round trip and one-line validation errors."""

import pytest

from diffquant.quant import ActQuant, QuantConfig, WeightQuant


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert message and "\n" not in message
    return message


def test_json_round_trip_of_a_full_config(tmp_path):
    qc = QuantConfig(
        weights=WeightQuant("gptq", bits=4, group_size=128, symmetric=False, act_order=True, damp=0.05),
        logits=ActQuant(4, "head"), probs=ActQuant(8, "row"), qk=ActQuant(8), hidden=ActQuant(6, "token"),
        activations=ActQuant(8, "token", unquantized_at_16=False))
    assert QuantConfig.from_json(qc.to_json()) == qc
    qc.to_json(tmp_path / "q.json")
    assert QuantConfig.from_json(tmp_path / "q.json") == qc
    assert QuantConfig.from_dict(QuantConfig().to_dict()) == QuantConfig()


def test_bnb_methods_imply_their_bits():
    assert WeightQuant("bnb-int8").bits == 8
    assert WeightQuant("bnb-nf4").bits == WeightQuant("bnb-fp4").bits == 4
    assert WeightQuant.from_dict(WeightQuant("bnb-nf4").to_dict()) == WeightQuant("bnb-nf4")


def test_sixteen_bits_means_unquantized_unless_asked():
    assert ActQuant(16).is_noop and not ActQuant(16, unquantized_at_16=False).is_noop
    assert QuantConfig(logits=ActQuant(16)).probe_targets() == {}
    assert set(QuantConfig(qk=ActQuant(8)).probe_targets()) == {"attn_q", "attn_k"}
    assert not QuantConfig(logits=ActQuant(16)).needs_eager and QuantConfig(probs=ActQuant(8)).needs_eager


@pytest.mark.parametrize("make, words", [
    (lambda: ActQuant(bits=1), "2..16"),
    (lambda: ActQuant(bits=17), "2..16"),
    (lambda: ActQuant(bits=8.0), "2..16"),
    (lambda: ActQuant(bits=8, granularity="channel"), "granularity"),
    (lambda: WeightQuant("rtn", bits=1), "2..8"),
    (lambda: WeightQuant("rtn", bits=17), "2..8"),
    (lambda: WeightQuant("rtn"), "needs bits"),
    (lambda: WeightQuant("awq", bits=4), "unknown weight method"),
    (lambda: WeightQuant("rtn", bits=4, group_size=0), "group_size"),
    (lambda: WeightQuant("gptq", bits=4, damp=0), "damp"),
    (lambda: WeightQuant("bnb-int8", bits=4), "8-bit"),
    (lambda: WeightQuant("bnb-nf4", group_size=64), "takes no"),
    (lambda: QuantConfig(hidden=ActQuant(8, "head")), "attention probes only"),
    (lambda: QuantConfig(weights=ActQuant(8)), "WeightQuant"),
    (lambda: QuantConfig(weights=WeightQuant("bnb-int8"), activations=ActQuant(8)), "drop activations"),
    (lambda: QuantConfig.from_dict({"weights": {"method": "rtn", "bits": 4, "colour": 1}}), "unknown WeightQuant"),
    (lambda: QuantConfig.from_dict({"logitz": None}), "unknown QuantConfig"),
    (lambda: QuantConfig.from_json("{not json"), "not valid JSON"),
])
def test_bad_settings_are_one_line_errors(make, words):
    with pytest.raises(ValueError) as excinfo:
        make()
    assert words in one_line(excinfo)
