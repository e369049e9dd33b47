"""quantize_ / quantize: what gets selected, what is left alone, and the input model never changing."""

import copy

import pytest
import torch
from torch import nn

from diffquant import build_model
from diffquant.quant import (
    ActQuant,
    InputQuantLinear,
    QuantConfig,
    QuantEmbedding,
    QuantLinear,
    QuantProbe,
    WeightQuant,
    default_filter,
    is_quantized,
    quantize_,
    quantize_model,
)
from tests.conftest import tiny_config
from tests.helpers import randomize_

FULL = QuantConfig(weights=WeightQuant("gptq", bits=4, group_size=16, act_order=True), logits=ActQuant(4),
                   probs=ActQuant(8), qk=ActQuant(8, "head"), hidden=ActQuant(8), activations=ActQuant(8, "token"))


def test_quantize_leaves_the_float_model_untouched(arch):
    model = randomize_(build_model(tiny_config(arch, attn_impl="sdpa")))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    modules_before = [(n, type(m)) for n, m in model.named_modules()]
    q = quantize_model(model, FULL, calib=torch.randint(0, 101, (8, 16)))
    after = model.state_dict()
    assert list(after) == list(before) and all(torch.equal(before[k], after[k]) for k in before)
    assert [(n, type(m)) for n, m in model.named_modules()] == modules_before
    assert model.config.attn_impl == "sdpa" and not is_quantized(model)
    assert q is not model and is_quantized(q) and q.quant_config == FULL


def test_quantize_in_place_returns_the_same_model_and_refuses_twice(tiny):
    model = build_model(tiny)
    assert quantize_(model, QuantConfig(weights=WeightQuant("rtn", bits=4))) is model
    with pytest.raises(ValueError, match="already quantized"):
        quantize_(model, QuantConfig(logits=ActQuant(4)))


def test_default_selection_is_the_block_linears(arch):
    q = quantize_model(build_model(tiny_config(arch)), QuantConfig(weights=WeightQuant("rtn", bits=4)))
    quantized = {n for n, m in q.named_modules() if isinstance(m, QuantLinear)}
    assert quantized == {n for n, m in build_model(tiny_config(arch)).named_modules()
                         if default_filter(n, m)}
    assert len(quantized) == 14 and type(q.head) is nn.Linear and type(q.embed) is nn.Embedding
    assert q.head.weight is q.embed.weight  # the float tie survives


def test_filter_fn_chooses_the_linear_layers(tiny):
    model = build_model(tiny)
    q = quantize_model(model, QuantConfig(weights=WeightQuant("rtn", bits=4), activations=ActQuant(8)),
                       filter_fn=lambda name, m: isinstance(m, nn.Linear) and name.endswith("down_proj"))
    kinds = {n: type(m) for n, m in q.named_modules() if isinstance(m, (nn.Linear, QuantLinear))}
    assert {n for n, t in kinds.items() if t is QuantLinear} == {"layers.0.mlp.down_proj", "layers.1.mlp.down_proj"}
    assert all(q.get_submodule(n).act == ActQuant(8) for n, t in kinds.items() if t is QuantLinear)
    with pytest.raises(ValueError, match="nothing to quantize"):
        quantize_model(model, QuantConfig(weights=WeightQuant("rtn", bits=4)), filter_fn=lambda n, m: False)


def test_embeddings_and_a_tied_head_share_one_set_of_codes(arch):
    model = randomize_(build_model(tiny_config(arch)))
    q = quantize_model(model, QuantConfig(weights=WeightQuant("rtn", bits=4, group_size=8, embeddings=True)))
    assert isinstance(q.embed, QuantEmbedding) and isinstance(q.head, QuantLinear)
    assert q.head.qweight is q.embed.qweight and q.head.scale is q.embed.scale
    ids = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(q.head.dequantized_weight(), q.embed.dequantized_weight())
        assert torch.isfinite(q(ids)).all()


def test_an_untied_head_is_quantized_by_gptq_with_the_blocks():
    model = randomize_(build_model(tiny_config(tie_embeddings=False)))
    q = quantize_model(model, QuantConfig(weights=WeightQuant("gptq", bits=4, embeddings=True)),
                       calib=torch.randint(0, 101, (4, 10)))
    assert isinstance(q.head, QuantLinear) and isinstance(q.embed, QuantEmbedding)
    assert q.head.qweight is not q.embed.qweight


def test_a_quantized_model_deep_copies_and_keeps_working(arch):
    q = quantize_model(randomize_(build_model(tiny_config(arch))), FULL, calib=torch.randint(0, 101, (4, 10)))
    twin = copy.deepcopy(q)
    ids = torch.randint(0, 101, (2, 11))
    with torch.no_grad():
        assert torch.equal(twin(ids), q(ids))
    kinds = {type(m) for m in twin.modules()}
    assert {QuantLinear, QuantProbe} <= kinds and InputQuantLinear not in kinds  # inputs ride on QuantLinear


def test_bad_calibration_data_is_refused(tiny):
    model = build_model(tiny)
    with pytest.raises(ValueError, match="token-id tensors"):
        quantize_model(model, QuantConfig(weights=WeightQuant("gptq", bits=4)), calib=[torch.randn(2, 5)])
    with pytest.raises(ValueError, match="QuantConfig"):
        quantize_model(model, {"weights": None})
