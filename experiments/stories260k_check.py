"""Check that the shipped stories260K GGUF model loads right: greedy sample, loss, and an HF cross-check.

    OMP_NUM_THREADS=1 python experiments/stories260k_check.py [--window 256] [--out record.json]

* greedy decoding from BOS must reproduce the documented sample ("Once upon a time, there was a little
  girl named Lily. She loved to play outside in the park. ...");
* loss on the cased TinyStories sample (``load_documents("tinystories-cased")``): data.py reads that file
  as one document (its stories are separated by blank lines, like paragraphs, so there are no story
  separators), encoded with the SentencePiece tokenizer with one BOS at the start, cut into contiguous
  non-overlapping windows (inputs ids[i:i+W], targets ids[i+1:i+W+1]), mean next-token cross-entropy in
  nats over every target; also reported without the blank lines' second newline tokens, which the model
  almost never saw (it writes one newline between paragraphs);
* the same weights in transformers' LlamaForCausalLM (rotate-half RoPE, so q/k rows are un-permuted from
  llama.cpp's interleaved layout as convert_hf_to_gguf would) give the same logits.

Prints one JSON record (and writes it with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from diffquant.checkpoint import load_checkpoint
from diffquant.checkpoint.gguf import stories260k_path, stories260k_tokenizer_path
from diffquant.data import data_fingerprint, encode_documents, load_documents
from diffquant.generate import greedy_generate
from diffquant.model import LM
from diffquant.tokenizer import Tokenizer

NEWLINE_PIECE = "<0x0A>"


def window_losses(model: LM, ids: torch.Tensor, window: int, batch: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-target losses (float64) and (input, target) pairs over contiguous non-overlapping windows."""
    n = (len(ids) - 1) // window
    x = ids[: n * window].view(n, window)  # (N, W)
    y = ids[1: n * window + 1].view(n, window)  # (N, W)
    losses = []
    with torch.inference_mode():
        for i in range(0, n, batch):
            logits = model(x[i:i + batch]).double()  # (b, W, V)
            losses.append(F.cross_entropy(logits.flatten(0, 1), y[i:i + batch].flatten(), reduction="none"))
    return torch.cat(losses), torch.stack([x.flatten(), y.flatten()])


def unpermute_rope_rows(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's interleaved q/k rows -> HF's rotate-half rows (inverse of convert_hf_to_gguf.permute)."""
    d = w.shape[0] // heads
    return w.reshape(heads, d // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def hf_max_logit_diff(model: LM, ids: torch.Tensor) -> float | None:
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return None
    c = model.config
    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.ffn_dim,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps,
        rope_theta=c.rope_theta, tie_word_embeddings=c.tie_embeddings)).eval()
    state = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm.weight,
             "lm_head.weight": model.head.weight}
    for i, b in enumerate(model.layers):
        p = f"model.layers.{i}."
        state[p + "self_attn.q_proj.weight"] = unpermute_rope_rows(b.attn.q_proj.weight, c.n_heads)
        state[p + "self_attn.k_proj.weight"] = unpermute_rope_rows(b.attn.k_proj.weight, c.n_kv_heads)
        state[p + "self_attn.v_proj.weight"] = b.attn.v_proj.weight
        state[p + "self_attn.o_proj.weight"] = b.attn.out_proj.weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            state[p + f"mlp.{name}.weight"] = getattr(b.mlp, name).weight
        state[p + "input_layernorm.weight"] = b.attn_norm.weight
        state[p + "post_attention_layernorm.weight"] = b.mlp_norm.weight
    hf.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)
    with torch.inference_mode():
        return float((model(ids) - hf(ids).logits).abs().max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=120)
    parser.add_argument("--out", help="also write the JSON record here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.time()

    model = load_checkpoint(stories260k_path())
    tok = Tokenizer.load(stories260k_tokenizer_path())
    sample = greedy_generate(model, torch.tensor([[tok.bos_id]]), args.new_tokens)
    text = tok.decode(sample[0].tolist())

    docs = load_documents("tinystories-cased")
    ids = torch.from_numpy(encode_documents(tok, docs).astype(np.int64))
    losses, (x, y) = window_losses(model, ids, args.window)
    newline = tok.backend.piece_to_id(NEWLINE_PIECE)
    blank = (x == newline) & (y == newline)  # the second newline of a blank line
    sdpa_losses, _ = window_losses(load_checkpoint(stories260k_path(), attn_impl="sdpa"), ids, args.window)

    record = {
        "model": str(stories260k_path()),
        "config": model.config.to_dict(),
        "greedy_from_bos": text,
        "loss": {
            "data": "tinystories-cased", "data_sha256": data_fingerprint(docs),
            "tokenizer": str(stories260k_tokenizer_path()), "bos": "one, at the start (no story separators)",
            "window": args.window, "tokens_scored": int(losses.numel()), "tokens_total": int(len(ids)),
            "nats_per_token": float(losses.mean()),
            "nats_per_token_sdpa": float(sdpa_losses.mean()),
            "blank_line_second_newlines": int(blank.sum()),
            "nats_on_those": float(losses[blank].mean()),
            "nats_per_token_without_those": float(losses[~blank].mean()),
        },
        "hf_llama_max_abs_logit_diff": hf_max_logit_diff(model, ids[: args.window][None]),
        "seconds": round(time.time() - start, 1),
    }
    json.dump(record, sys.stdout, indent=2)
    print()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(record, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
