"""hooked() on fused attention (runs eager inside the block, restores) and text_batches()."""
import types

import pytest
import torch
from torch import nn

import diffquant as dq
from diffquant.probes import Probe
from diffquant.tokenizer import default_tokenizer

from .conftest import tiny_config


def test_logit_probes_fire_on_an_sdpa_model_and_the_model_is_restored(arch):
    torch.manual_seed(0)
    model = dq.build_model(tiny_config(arch, attn_impl="sdpa")).eval()
    ids = torch.randint(0, 101, (2, 12))
    with torch.no_grad():
        plain = model(ids)
        seen = []
        with dq.hooked(model, lambda name, probe, x, call: seen.append(name), kinds="attn_logits"):
            assert all(b.attn.impl == "eager" for b in model.layers)
            hooked_out = model(ids)
    assert seen == [f"layers.{i}.attn.logits" for i in range(model.config.n_layers)]
    assert model.config.attn_impl == "sdpa" and all(b.attn.impl == "sdpa" for b in model.layers)
    torch.testing.assert_close(hooked_out, plain, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="boom"), dq.hooked(model, lambda *a: None, kinds="attn_probs"):
        raise RuntimeError("boom")
    assert model.config.attn_impl == "sdpa"
    with dq.hooked(model, lambda *a: None, kinds="hidden"):  # fires on every path: nothing switched
        assert all(b.attn.impl == "sdpa" for b in model.layers)
    model.set_attn_impl("sdpa", chunk=4)
    with dq.hooked(model, lambda *a: None, kinds="attn_logits"):  # the query-chunk setting is kept
        assert all((b.attn.impl, b.attn.chunk) == ("eager", 4) for b in model.layers)
    assert all((b.attn.impl, b.attn.chunk) == ("sdpa", 4) for b in model.layers)


def test_a_fused_model_that_cannot_switch_gets_a_warning(caplog):
    model = nn.Module()
    model.config = types.SimpleNamespace(attn_impl="sdpa")
    model.logits = Probe("attn_logits")
    with caplog.at_level("WARNING"), dq.hooked(model, lambda *a: None, kinds="attn_logits") as chosen:
        assert list(chosen) == ["logits"]
    assert "never fire on sdpa attention" in caplog.text


def test_profiling_an_sdpa_model_does_not_warn(caplog):
    """profile() switches the attention modules to eager itself; the config still says sdpa: no false alarm."""
    model = dq.build_model(tiny_config("diff", attn_impl="sdpa")).eval()
    with caplog.at_level("WARNING"):
        report = dq.profile(model, [torch.randint(0, 101, (2, 12))], progress=False)
    assert report.data["sites"]["attn_logits"]["count"] > 0 and "never fire" not in caplog.text


def test_text_batches_are_whole_windows_of_the_texts_with_bos():
    tok = default_tokenizer()
    texts = ["Once upon a time there was a cat. " * 20, "The end of the story came soon. " * 20]
    batches = dq.text_batches(texts, tok, seq_len=16, batch_size=3, max_tokens=100)
    assert [tuple(b.shape) for b in batches] == [(3, 16), (3, 16)]  # 100 tokens -> 6 whole windows of 16
    flat = torch.cat(batches).flatten().tolist()
    assert flat == ([tok.bos_id, *tok.encode(texts[0]), tok.bos_id, *tok.encode(texts[1])])[:96]
    assert all(b.dtype == torch.long for b in batches)
    one = dq.text_batches("Hello there, little cat.", tok, seq_len=4)
    assert torch.cat(one).flatten().tolist()[0] == tok.bos_id
    with pytest.raises(ValueError, match="fewer than one window of 512"):
        dq.text_batches("Too short.", tok, seq_len=512)
    with pytest.raises(ValueError, match="seq_len must be a positive integer"):
        dq.text_batches("x", tok, seq_len=0)
