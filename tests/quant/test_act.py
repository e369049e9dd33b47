"""Dynamic quantizers at probes and Linear inputs: masks, per-sequence scales, 16-bit no-op, references."""

import itertools
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from diffquant import build_model, hooked, probes
from diffquant.probes import Probe, real_lengths
from diffquant.quant import (
    ActQuant,
    InputQuantLinear,
    PerAxis,
    QuantConfig,
    QuantProbe,
    act_granularity,
    quantize_model,
)
from tests.conftest import tiny_config
from tests.helpers import randomize_


def reference_absmax(x: torch.Tensor, bits: int, keep_dims: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Symmetric absmax with one scale per index of the first ``keep_dims`` dims, by explicit loops (a slice with
    no entry that counts gets zeros)."""
    qmax = 2 ** (bits - 1) - 1
    out = torch.zeros_like(x)
    full_mask = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.expand(x.shape)
    for idx in itertools.product(*[range(n) for n in x.shape[:keep_dims]]):
        counted = x[idx][full_mask[idx]]
        if counted.numel() == 0:
            continue
        scale = counted.abs().max() / qmax
        out[idx] = torch.clamp(torch.round(x[idx] / scale), -qmax, qmax) * scale
    return out


def model_and_ids(arch, **cfg):
    model = randomize_(build_model(tiny_config(arch, **cfg))).eval()
    return model, torch.randint(0, 101, (3, 24))


def logits_shape(arch, B=2, T=7):
    return (B, 2, 2, T, T) if arch == "diff" else (B, 4, T, T)


def test_granularities_map_to_explicit_reductions():
    assert act_granularity("sequence", 4) == PerAxis((0,))
    assert act_granularity("row", 5) == act_granularity("token", 5) == PerAxis((0, 1, 2, 3))
    assert act_granularity("head", 4, "attn_logits") == PerAxis((0, 1))
    assert act_granularity("head", 5, "attn_logits") == PerAxis((0, 1))  # Diff: both maps share the scale
    assert act_granularity("head_map", 5, "attn_logits") == PerAxis((0, 1, 2))  # Diff: per head and map
    assert act_granularity("head_map", 4, "attn_logits") == act_granularity("head", 4, "attn_logits")
    assert act_granularity("head", 4, "attn_q") == act_granularity("head_map", 4, "attn_q") == PerAxis((0, 1))
    for granularity in ("head", "head_map"):
        with pytest.raises(ValueError, match="attention probes only"):
            act_granularity(granularity, 3, "hidden")
    with pytest.raises(ValueError, match="attention probes only"):
        QuantProbe("hidden", ActQuant(8, "head"))


@pytest.mark.parametrize("granularity, keep", [("sequence", 1), ("head", 2), ("head_map", None), ("row", None)])
def test_logit_quantizer_matches_a_loop_reference_over_kept_entries(arch, granularity, keep):
    x = 3 * torch.randn(logits_shape(arch))
    probe = QuantProbe("attn_logits", ActQuant(4, granularity))
    mask = probe.causal_mask(x)
    keep = keep or {"head_map": 3 if arch == "diff" else 2, "row": x.ndim - 1}[granularity]
    assert torch.equal(probe(x), reference_absmax(x, 4, keep, mask))


def test_a_huge_masked_logit_does_not_change_the_scale(arch):
    x = torch.randn(logits_shape(arch))
    probe = QuantProbe("attn_logits", ActQuant(4, "sequence"))
    keep = probe.causal_mask(x).expand(x.shape)
    planted = x.clone()
    planted[..., 0, 3] = 1e4  # query 0 may not see key 3
    clean, dirty = probe(x), probe(planted)
    assert torch.equal(clean[keep], dirty[keep])


def test_in_a_model_a_planted_masked_logit_changes_nothing(arch):
    model, ids = model_and_ids(arch)
    q = quantize_model(model, QuantConfig(logits=ActQuant(4)))
    clean = q(ids)

    def plant(module, args):
        x, *rest = args
        x = x.clone()
        x[..., 0, 1:] = 1e6  # above the diagonal: never seen by softmax
        return (x, *rest)

    handles = [p.register_forward_pre_hook(plant) for p in probes(q, "attn_logits").values()]
    try:
        assert torch.equal(q(ids), clean)
    finally:
        for h in handles:
            h.remove()


def test_results_do_not_depend_on_the_batch(arch):
    model, ids = model_and_ids(arch)
    cfg = QuantConfig(logits=ActQuant(4), probs=ActQuant(6, "head"), qk=ActQuant(6), hidden=ActQuant(8),
                      activations=ActQuant(6, "sequence"))
    q = quantize_model(model, cfg)
    ids[1, 5:] = ids[1, 5]  # make the batch mates different in kind, not only in value
    with torch.no_grad():
        batched = q(ids)
        for b in range(ids.shape[0]):
            assert torch.equal(q(ids[b:b + 1])[0], batched[b])


def padded_mask(shape, lengths, causal: bool) -> torch.Tensor:
    """Entries that count, by explicit loops: position (dim -2) inside its row's length, and key <= query."""
    keep = torch.zeros(shape, dtype=torch.bool)
    for idx in itertools.product(*[range(n) for n in shape]):
        pos = idx[-2]
        keep[idx] = pos < lengths[idx[0]] and (not causal or idx[-1] <= pos)
    return keep


@pytest.mark.parametrize("granularity, keep", [("sequence", 1), ("head", 2), ("row", None)])
def test_padded_positions_never_set_a_logit_scale_float64_reference(arch, granularity, keep):
    lengths = (4, 7)
    x = 3 * torch.randn(logits_shape(arch), dtype=torch.float64)
    x[0, ..., 5, 1] = 1e3  # a padded query of row 0: would own the scale if it counted
    probe = QuantProbe("attn_logits", ActQuant(4, granularity))
    with real_lengths(lengths):
        got = probe(x)
    assert torch.equal(got, reference_absmax(x, 4, keep or x.ndim - 1, padded_mask(x.shape, lengths, causal=True)))
    if granularity != "row":  # outside the block the planted padding sets row 0's scale
        assert not torch.equal(probe(x)[0, ..., :4, :], got[0, ..., :4, :])


def test_padded_tokens_never_set_a_hidden_or_linear_input_scale_float64_reference():
    lengths = (3, 6, 2)
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    x[2, 4] = 50.0  # padding of row 2
    expected = reference_absmax(x, 5, 1, padded_mask(x.shape, lengths, causal=False))
    layer = InputQuantLinear.from_linear(nn.Linear(8, 4, dtype=torch.float64), ActQuant(5, "sequence"))
    with real_lengths(lengths):
        hidden = QuantProbe("hidden", ActQuant(5, "sequence"))(x)
        out = layer(x)
    assert torch.equal(hidden, expected)
    assert torch.equal(out, F.linear(expected, layer.weight, layer.bias))


@pytest.mark.parametrize("gran", ["sequence", "head"])
def test_a_padded_sequence_is_quantized_as_alone(arch, gran):
    """Each row of a right-padded batch gives what it gives alone (float32, exact)."""
    model, ids = model_and_ids(arch)
    cfg = QuantConfig(logits=ActQuant(4, gran), probs=ActQuant(6, "head"), qk=ActQuant(6, gran),
                      hidden=ActQuant(8), activations=ActQuant(6, "sequence"))
    q = quantize_model(model, cfg)
    lengths = (24, 9, 15)
    for b, n in enumerate(lengths):
        ids[b, n:] = 100  # padding unlike any real token: large activations if it counted
    with torch.no_grad():
        with real_lengths(lengths):
            batched = q(ids)
        unmasked = q(ids)
        for b, n in enumerate(lengths):
            alone = q(ids[b:b + 1, :n])[0]
            assert torch.equal(alone, batched[b, :n])
    assert not torch.equal(unmasked[1, :9], batched[1, :9])  # without the lengths the padding leaks in


def test_real_lengths_refuses_a_batch_it_does_not_describe():
    with pytest.raises(ValueError, match="positive"):
        with real_lengths([3, 0]):
            pass
    with real_lengths([3, 2]), pytest.raises(ValueError, match="batch 3"):
        QuantProbe("hidden", ActQuant(8))(torch.randn(3, 4, 5))


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_sixteen_bits_is_exactly_unquantized_and_fewer_bits_cost_more(arch):
    model, ids = model_and_ids(arch)
    with torch.no_grad():
        ref = model(ids)
        everything16 = QuantConfig(logits=ActQuant(16), probs=ActQuant(16), qk=ActQuant(16), hidden=ActQuant(16),
                                   activations=ActQuant(16, "token"))
        assert torch.equal(quantize_model(model, everything16)(ids), ref)
        int16 = quantize_model(model, QuantConfig(logits=ActQuant(16, unquantized_at_16=False)))(ids)
        errs = {bits: rel_err(quantize_model(model, QuantConfig(logits=ActQuant(bits)))(ids), ref)
                for bits in (8, 6, 4)}
    assert 0 < rel_err(int16, ref) < 1e-3
    assert errs[8] < 0.1 and errs[8] < errs[6] < errs[4] and errs[4] > 5 * errs[8], errs


def test_observers_see_values_on_the_quantization_grid(arch):
    model, ids = model_and_ids(arch)
    q = quantize_model(model, QuantConfig(logits=ActQuant(4), qk=ActQuant(3), hidden=ActQuant(5)))
    levels = {"attn_logits": 2 ** 3 - 1, "attn_q": 2 ** 2 - 1, "attn_k": 2 ** 2 - 1, "hidden": 2 ** 4 - 1}
    seen = []

    def observe(name, probe, x, call):
        assert isinstance(probe, QuantProbe)
        keep = probe.causal_mask(x, call.q_offset)
        vals = x[0] if keep is None else x[0][keep[0].expand(x[0].shape)]
        assert vals.abs().unique().numel() <= levels[probe.kind] + 1  # codes 0..qmax
        seen.append(probe.kind)

    with hooked(q, observe, kinds=tuple(levels)), torch.no_grad():
        q(ids)
    assert set(seen) == set(levels)


def test_chunked_attention_with_per_sequence_scales_is_refused(arch):
    model, ids = model_and_ids(arch)
    model.set_attn_impl("eager", chunk=8)
    with pytest.raises(ValueError, match="unchunked"):
        quantize_model(model, QuantConfig(logits=ActQuant(4, "sequence")))
    model.set_attn_impl("eager")
    q = quantize_model(model, QuantConfig(logits=ActQuant(4, "head")))
    q.set_attn_impl("eager", chunk=8)  # chunked after quantizing: refused at forward time
    with pytest.raises(RuntimeError, match="unchunked"):
        q(ids)


def test_per_row_logits_work_with_chunks(arch):
    model, ids = model_and_ids(arch)
    q = quantize_model(model, QuantConfig(logits=ActQuant(4, "row")))
    with torch.no_grad():
        whole = q(ids)
        q.set_attn_impl("eager", chunk=8)
        chunked = q(ids)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)


def test_fused_attention_is_switched_to_eager(arch, caplog):
    model, ids = model_and_ids(arch, attn_impl="sdpa")
    with caplog.at_level(logging.INFO, logger="diffquant.quant"):
        q = quantize_model(model, QuantConfig(logits=ActQuant(4)))
    assert q.config.attn_impl == "eager" and model.config.attn_impl == "sdpa"
    assert "eager" in caplog.text
    with torch.no_grad():
        assert not torch.equal(q(ids), model(ids))


def test_linear_inputs_are_quantized_per_token_keeping_the_parameters(arch):
    model, ids = model_and_ids(arch)
    keys = list(model.state_dict())
    q = quantize_model(model, QuantConfig(activations=ActQuant(4, "token")))
    assert list(q.state_dict()) == keys
    layer = q.layers[0].mlp.up_proj
    assert isinstance(layer, InputQuantLinear) and type(q.head) is nn.Linear  # the head stays float
    x = torch.randn(2, 5, layer.in_features)
    expected = F.linear(reference_absmax(x, 4, 2), layer.weight)
    assert torch.equal(layer(x), expected)


class ToyBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class ToyLM(nn.Module):
    """An HF-like model that knows nothing of probes: only module types and names are used."""

    def __init__(self, vocab=50, d=16):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(ToyBlock(d) for _ in range(2))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def test_models_without_probes_get_linear_inputs_but_refuse_logits():
    toy = ToyLM()
    q = quantize_model(toy, QuantConfig(activations=ActQuant(8, "token")))
    assert isinstance(q.layers[1].fc2, InputQuantLinear) and type(q.lm_head) is nn.Linear
    ids = torch.randint(0, 50, (2, 9))
    with torch.no_grad():
        assert rel_err(q(ids), toy(ids)) < 0.02
    with pytest.raises(ValueError, match="no attn_logits probes"):
        quantize_model(toy, QuantConfig(logits=ActQuant(4)))
    assert not any(isinstance(m, Probe) for m in q.modules())
