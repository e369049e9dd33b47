"""GGUF export: Q8_0 / Q4_0 blocks of our exact codes and of llama.cpp's own rounding, read back by gguf.

llama.cpp's rounding is checked byte for byte against a loop written here from ggml-quants.c
(quantize_row_q8_0_ref / quantize_row_q4_0_ref); our codes must dequantize (gguf.quants) to exactly our
dequantized weights; the vocabulary built from the SentencePiece model equals the one in stories260K.gguf.
"""

import json

import gguf
import numpy as np
import pytest
import torch

from diffquant import build_model
from diffquant.checkpoint import CheckpointError, load_checkpoint, save_quantized
from diffquant.checkpoint.gguf import stories260k_path, stories260k_tokenizer_path
from diffquant.cli import main
from diffquant.errors import UserError
from diffquant.exports import dequantized_copy
from diffquant.ggml_blocks import dequantize, encode_blocks, llamacpp_quantize
from diffquant.gguf_export import gguf_name, save_gguf
from diffquant.quant import QuantConfig, WeightQuant
from diffquant.quant.api import quantize
from diffquant.tokenizer import Tokenizer

from .conftest import tiny_config
from .helpers import randomize_


def _f16(x):
    return np.float32(x).astype(np.float16)


def _reference_q8_0(row: np.ndarray) -> bytes:
    """quantize_row_q8_0_ref: d = amax/127, q = roundf(x/d) (half away from zero), fp32 arithmetic."""
    out = b""
    for block in row.reshape(-1, 32).astype(np.float32):
        amax = np.float32(max(abs(float(v)) for v in block))
        d = np.float32(amax / np.float32(127))
        inv = np.float32(1) / d if d else np.float32(0)
        q = [int(np.sign(v * inv) * np.floor(abs(np.float32(v * inv)) + np.float32(0.5))) for v in block]
        out += _f16(d).tobytes() + np.array(q, dtype=np.int8).tobytes()
    return out


def _reference_q4_0(row: np.ndarray) -> bytes:
    """quantize_row_q4_0_ref: d = (signed value of largest magnitude)/-8, q = min(15, (int8)(x/d + 8.5))."""
    out = b""
    for block in row.reshape(-1, 32).astype(np.float32):
        top = max(block, key=lambda v: abs(float(v)))  # first of the largest magnitude, sign kept
        d = np.float32(top / np.float32(-8))
        inv = np.float32(1) / d if d else np.float32(0)
        q = [min(15, int(np.float32(np.float32(v * inv) + np.float32(8.5)))) for v in block]
        packed = [q[j] | (q[j + 16] << 4) for j in range(16)]
        out += _f16(d).tobytes() + bytes(packed)
    return out


@pytest.mark.parametrize("qtype, reference", [("Q8_0", _reference_q8_0), ("Q4_0", _reference_q4_0)])
def test_llamacpp_rounding_matches_the_c_reference(qtype, reference):
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((6, 64)) * rng.uniform(0.01, 3, (6, 1))).astype(np.float32)
    w[0, :32] = 0  # an all-zero block: d = 0
    raw = llamacpp_quantize(w, qtype)
    assert b"".join(raw[r].tobytes() for r in range(6)) == b"".join(reference(w[r]) for r in range(6))


@pytest.mark.parametrize("qtype, lo, hi", [("Q8_0", -127, 127), ("Q4_0", -8, 7)])
@pytest.mark.parametrize("group", [32, 64, 96, 128, 256])  # 128: 128 + 64 columns; 256: one group, cut short
def test_our_codes_dequantize_exactly(qtype, lo, hi, group):
    rng = np.random.default_rng(group)
    signed = rng.integers(lo, hi + 1, size=(5, 192))
    scale = rng.uniform(1e-3, 2, size=(5, -(-192 // group))).astype(np.float16).astype(np.float32)
    raw = encode_blocks(signed, scale, group, qtype)
    expected = signed.astype(np.float64) * np.repeat(scale, group, axis=1)[:, :192]
    assert np.array_equal(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]), expected)


@pytest.mark.parametrize("why, signed, scale, group, qtype, message", [
    ("range", np.full((1, 32), 8), np.ones((1, 1), np.float32), 32, "Q4_0", "outside Q4_0's -8..7"),
    ("group", np.ones((1, 32)), np.ones((1, 2), np.float32), 16, "Q8_0", "groups of 16"),
    ("fp32 scale", np.ones((1, 32)), np.full((1, 1), 0.1, np.float32), 32, "Q8_0", "not float16 values"),
    ("width", np.ones((1, 40)), np.ones((1, 1), np.float32), 40, "Q8_0", "rows of 40 columns"),
])
def test_unrepresentable_codes_are_refused(why, signed, scale, group, qtype, message):
    with pytest.raises(UserError, match=message):
        encode_blocks(signed, scale, group, qtype)


def _tiny(**overrides):
    return randomize_(build_model(tiny_config(n_kv_heads=2, ffn_dim=96, **overrides))).eval()


def _read(path) -> dict[str, tuple[str, np.ndarray]]:
    reader = gguf.GGUFReader(str(path))
    return {t.name: (t.tensor_type.name, gguf.quants.dequantize(t.data, t.tensor_type)) for t in reader.tensors}


@pytest.mark.parametrize("qtype", ["q8_0", "q4_0"])
def test_float_model_is_rounded_by_llamacpp(qtype, tmp_path):
    model = _tiny()
    save_gguf(model, tmp_path / "m.gguf", qtype)
    tensors = _read(tmp_path / "m.gguf")
    for name, w in model.state_dict().items():
        if name == "head.weight" and model.config.tie_embeddings:
            continue  # llama.cpp reuses token_embd
        kind, data = tensors[gguf_name(name)]
        w = w.numpy()
        if name.startswith("layers.") and w.ndim == 2:
            assert kind == qtype.upper()
            assert np.array_equal(data, dequantize(llamacpp_quantize(w, kind), kind))
        else:
            assert kind == "F32" and np.array_equal(data.reshape(w.shape), w)
    loaded = load_checkpoint(tmp_path / "m.gguf")  # load_gguf dequantizes Q8_0 / Q4_0
    assert torch.equal(loaded.layers[1].mlp.up_proj.weight,
                       torch.from_numpy(tensors["blk.1.ffn_up.weight"][1]))


@pytest.mark.parametrize("qtype, wq", [
    ("q4_0", WeightQuant("rtn", bits=4, group_size=32)),
    ("q4_0", WeightQuant("gptq", bits=4, group_size=32)),  # the "full" grid: codes 0..15 around 8
    ("q4_0", WeightQuant("rtn", bits=3, group_size=32)),
    ("q4_0", WeightQuant("rtn", bits=4, group_size=64)),  # ragged: widths 32 (one short group) and 96 (64 + 32)
    ("q4_0", WeightQuant("gptq", bits=4, group_size=64)),
    ("q8_0", WeightQuant("rtn", bits=8, group_size=None)),
    ("q8_0", WeightQuant("rtn", bits=4, group_size=32, symmetric=False)),  # code - zero in -15..15
])
def test_our_quantized_model_is_written_exactly(qtype, wq, tmp_path):
    model = _tiny()
    calib = torch.randint(0, model.config.vocab_size, (8, 16)) if wq.method == "gptq" else None
    save_quantized(quantize(model, QuantConfig(weights=wq), calib=calib), tmp_path / "q", dtype=torch.float16)
    packed = load_checkpoint(tmp_path / "q")  # fp16 scales, as `diffquant quantize` stores them
    save_gguf(packed, tmp_path / "m.gguf", qtype)
    tensors, reference = _read(tmp_path / "m.gguf"), dequantized_copy(packed)
    for name, w in reference.state_dict().items():
        if name == "head.weight" and reference.config.tie_embeddings:
            continue
        kind, data = tensors[gguf_name(name)]
        assert kind == (qtype.upper() if name.startswith("layers.") and w.ndim == 2 else "F32"), name
        assert np.array_equal(data.reshape(w.shape), w.numpy()), name
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(load_checkpoint(tmp_path / "m.gguf")(ids), packed(ids))


def test_unrepresentable_quantized_models_are_refused_by_module(tmp_path):
    model = _tiny()
    q8 = quantize(model, QuantConfig(weights=WeightQuant("rtn", bits=8, group_size=32)))
    with pytest.raises(CheckpointError, match=r"layers\.0\.attn\.q_proj \(8-bit, group 32\).*outside Q4_0"):
        save_gguf(q8, tmp_path / "a.gguf", "q4_0")
    with pytest.raises(CheckpointError, match="scales are not float16 values"):
        save_gguf(q8, tmp_path / "b.gguf", "q8_0")  # in memory: float32 scales
    assert not list(tmp_path.iterdir())
    with pytest.raises(CheckpointError, match="only Transformer"):
        save_gguf(randomize_(build_model(tiny_config("diff"))), tmp_path / "c.gguf")


def test_vocabulary_from_sentencepiece_equals_the_original_file(tmp_path):
    model = load_checkpoint(stories260k_path())
    save_gguf(model, tmp_path / "m.gguf", tokenizer=Tokenizer.load(stories260k_tokenizer_path()))
    ours, original = gguf.GGUFReader(str(tmp_path / "m.gguf")), gguf.GGUFReader(str(stories260k_path()))
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                "tokenizer.ggml.unknown_token_id"):
        assert ours.fields[key].contents() == original.fields[key].contents(), key
    for t in original.tensors:  # F32 export of the F32 file: the same tensors
        mine = next(x for x in ours.tensors if x.name == t.name)
        assert np.array_equal(np.asarray(mine.data), np.asarray(t.data)), t.name


def test_cli_gguf_export_and_one_line_refusals(tmp_path, capsys):
    src = stories260k_path()
    assert main(["convert", str(src), str(tmp_path / "q8.gguf"), "--to", "gguf", "--gguf-type", "q8_0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # F32: norms, embedding, head and ffn_down (172 columns do not split into blocks of 32)
    assert summary["tensor_types"] == {"F32": 18, "Q8_0": 30} and summary["vocabulary"]
    for argv, message in (
        (["--to", "hf", "--gguf-type", "q4_0"], "--gguf-type and --embeddings go with --to gguf"),
        (["--to", "gguf", "--dtype", "float16"], "--dtype does not apply"),
    ):
        assert main(["convert", str(src), str(tmp_path / "x.gguf"), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err
