"""The other outlier-suppressing arms (gated attention, clipped softmax): matching, probes, kernels, caching,
checkpoints. Their outputs are checked against float64 references of the papers' formulas in test_model.py."""

import pytest
import torch

from diffquant import ModelConfig, build_model, hooked, load_checkpoint, num_params, probes, save_checkpoint
from diffquant.model import KVCache

from .conftest import tiny_config
from .helpers import randomize_

ARMS = ["gated", "clipped"]


def test_clipping_makes_exact_zeros():
    cfg = tiny_config("clipped")
    model = randomize_(build_model(cfg)).eval()
    seen = {}
    with torch.no_grad(), hooked(model, lambda n, p, x, c: seen.setdefault(p.kind, x),
                                 kinds=("attn_probs", "attn_clipped")):
        model(torch.randint(0, cfg.vocab_size, (1, 40)))
    soft, clipped = seen["attn_probs"], seen["attn_clipped"]
    keep = torch.tril(torch.ones(40, 40, dtype=torch.bool))
    assert (soft[..., keep] > 0).all() and (clipped[..., keep] == 0).sum() > 0  # zeros softmax cannot make
    assert (clipped[..., ~keep] == 0).all() and clipped.max() <= 1


@pytest.mark.parametrize("preset", ["tiny", "small", "xs", "s"])
def test_arms_are_parameter_matched_within_one_percent(preset):
    counts = {arch: num_params(build_model(ModelConfig.preset(preset, arch=arch)))
              for arch in ("transformer", "diff", *ARMS)}
    for arch, n in counts.items():
        assert abs(n - counts["transformer"]) / counts["transformer"] < 0.01, (arch, counts)
    assert counts["clipped"] == counts["transformer"]
    gated = ModelConfig.preset(preset, arch="gated")
    assert gated.matched("transformer") == ModelConfig.preset(preset)
    assert gated.matched("diff") == ModelConfig.preset(preset, arch="diff")


@pytest.mark.parametrize("arm", ARMS)
def test_eager_sdpa_cache_and_causality(arm):
    cfg = tiny_config("transformer", n_kv_heads=2).matched(arm)
    model = randomize_(build_model(cfg)).eval()
    ids = torch.randint(0, cfg.vocab_size, (3, 30))
    with torch.no_grad():
        eager = model.set_attn_impl("eager")(ids)
        sdpa = model.set_attn_impl("sdpa")(ids)  # clipped: computed eagerly whatever the setting
        cache = KVCache(cfg, 3, 30)
        stepwise = torch.cat([model(ids[:, :10], cache)] + [model(ids[:, t:t + 1], cache) for t in range(10, 30)], 1)
        changed = ids.clone()
        changed[:, 20:] = (changed[:, 20:] + 1) % cfg.vocab_size
        later = model(changed)
    scale = eager.abs().max()
    assert (eager - sdpa).abs().max() <= 1e-5 * scale and (eager - stepwise).abs().max() <= 1e-5 * scale
    assert torch.equal(later[:, :20], sdpa[:, :20]) and not torch.equal(later[:, 20:], sdpa[:, 20:])


def test_query_chunked_eager_training_matches_whole_maps():
    """Training runs the clipped arm's eager attention in query chunks (train.EAGER_CHUNK): same loss, same grads."""
    cfg = tiny_config("clipped")
    ids = torch.randint(0, cfg.vocab_size, (2, 41))
    results = []
    for chunk in (None, 8):
        torch.manual_seed(3)  # the same random weights both times
        model = randomize_(build_model(cfg)).set_attn_impl("eager", chunk)
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (loss0, grads0), (loss1, grads1) = results
    assert torch.allclose(loss0, loss1, rtol=1e-6, atol=0)
    for g0, g1 in zip(grads0, grads1, strict=True):  # float32 sums in another order: relative to the largest
        assert (g0 - g1).abs().max() <= 2e-5 * g0.abs().max()


@pytest.mark.parametrize("arm", ARMS)
def test_probes_and_checkpoint_round_trip(arm, tmp_path):
    cfg = tiny_config(arm)
    model = randomize_(build_model(cfg)).eval()
    kind = {"gated": "attn_gate", "clipped": "attn_clipped"}[arm]
    names = probes(model, kind)
    assert sorted(names) == [f"layers.{i}.attn.{'gate' if arm == 'gated' else 'clipped_probs'}" for i in range(2)]
    save_checkpoint(model, tmp_path / "ckpt")
    back = load_checkpoint(tmp_path / "ckpt")
    ids = torch.randint(0, cfg.vocab_size, (2, 17))
    with torch.no_grad():
        assert torch.equal(model(ids), back(ids))
    assert back.config == model.config


@pytest.mark.parametrize("arm", ARMS)
def test_hf_conversion_refuses_arms_transformers_lacks(arm, tmp_path, capsys):
    from diffquant.cli import main

    save_checkpoint(build_model(tiny_config(arm)), tmp_path / "ckpt")
    assert main(["convert", str(tmp_path / "ckpt"), "--to", "hf", str(tmp_path / "hf")]) == 2
    assert f"no architecture that computes the '{arm}' arm" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()
