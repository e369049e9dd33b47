"""compressed-tensors export: our RTN / GPTQ codes in the pack-quantized layout, written by compressed-tensors'
own compressor, loaded by its decompressor and by transformers.

The folder is decoded from the format description alone (an independent bit-by-bit reference) and must give our
codes exactly; compressed-tensors' decompressor must give our dequantized weights exactly; transformers loads it
and computes our logits.
"""

import json
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from diffquant import build_model
from diffquant.checkpoint import CheckpointError, load_checkpoint, save_quantized
from diffquant.checkpoint.hf import _row_maps
from diffquant.cli import main
from diffquant.compressed import hf_linear_name, pack_with_compressed_tensors, save_compressed
from diffquant.exports import block_int_weights, dequantized_copy
from diffquant.quant import ActQuant, QuantConfig, WeightQuant
from diffquant.quant.api import quantize

from .conftest import tiny_config
from .helpers import randomize_

SCHEMES = [  # (method, bits, group_size, symmetric, grid)
    ("rtn", 4, None, True, "absmax"),
    ("rtn", 4, 16, True, "absmax"),
    ("gptq", 4, 16, True, "full"),
    ("rtn", 8, None, True, "absmax"),
    ("rtn", 8, 32, True, "absmax"),
    ("rtn", 3, 16, True, "absmax"),
]


def _reference_unpack(words: np.ndarray, bits: int, cols: int) -> np.ndarray:
    """Signed codes from compressed-tensors' layout: element i at bits i·b.. of a little-endian word stream."""
    rows = words.shape[0]
    out = np.zeros((rows, cols), dtype=np.int64)
    u32 = words.astype(np.int64) & 0xFFFFFFFF
    for r in range(rows):
        for i in range(cols):
            value = 0
            for k in range(bits):
                p = i * bits + k
                value |= ((int(u32[r, p // 32]) >> (p % 32)) & 1) << k
            out[r, i] = value - (1 << (bits - 1))
    return out


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 7, 8])
def test_the_compressor_packs_our_codes_as_the_bitwise_reference_reads_them(bits):
    rng = np.random.default_rng(bits)
    cols = 45  # not a multiple of 32: the last words are partly padding
    q = torch.from_numpy(rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), size=(3, cols)))
    words = pack_with_compressed_tensors(q, {"num_bits": bits, "type": "int", "symmetric": True,
                                             "group_size": None, "strategy": "channel"})
    assert words.dtype == torch.int32 and words.shape == (3, -(-cols * bits // 32))
    assert np.array_equal(_reference_unpack(words.numpy(), bits, cols), q.numpy())


def test_without_compressed_tensors_the_export_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "compressed_tensors.compressors.pack_quantized.base", None)  # import fails
    with pytest.raises(CheckpointError, match=r"pip install 'diffquant\[export\]'") as info:
        save_compressed(_quantized("transformer", "rtn", 4, 16, True, "absmax"), tmp_path / "ct")
    assert "\n" not in str(info.value) and not (tmp_path / "ct").exists()


def _quantized(arch, method, bits, group, symmetric, grid, **cfg):
    model = randomize_(build_model(tiny_config(arch, n_kv_heads=2, **cfg))).eval()
    wq = WeightQuant(method, bits=bits, group_size=group, symmetric=symmetric, grid=grid)
    calib = torch.randint(0, model.config.vocab_size, (8, 16)) if method == "gptq" else None
    return quantize(model, QuantConfig(weights=wq), calib=calib)


def _decode(folder, hf_name, meta) -> torch.Tensor:
    """Integer weights q of one module, read from the folder by the format description alone."""
    t = load_file(str(folder / "model.safetensors"))
    shape = tuple(t[f"{hf_name}.weight_shape"].tolist())
    assert meta["symmetric"] and f"{hf_name}.weight_zero_point" not in t
    return torch.from_numpy(_reference_unpack(t[f"{hf_name}.weight_packed"].numpy(), meta["num_bits"], shape[1]))


@pytest.mark.parametrize("method, bits, group, symmetric, grid", SCHEMES)
def test_folder_holds_our_codes_exactly(arch, method, bits, group, symmetric, grid, tmp_path):
    qmodel = _quantized(arch, method, bits, group, symmetric, grid)
    save_compressed(qmodel, tmp_path / "ct")
    config = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["format"] == "pack-quantized"
    schemes = {name: g["weights"] for g in config["config_groups"].values() for name in g["targets"]}
    tensors = load_file(str(tmp_path / "ct" / "model.safetensors"))
    rows = _row_maps(qmodel.config)
    for name, w in block_int_weights(qmodel).items():
        hf = hf_linear_name(name)
        if hf in config["ignore"]:  # Diff's o_proj: dense, folded
            assert arch == "diff" and name.endswith("out_proj") and f"{hf}.weight" in tensors
            continue
        order = rows.get(name.rsplit(".", 1)[1], torch.arange(w.codes.shape[0]))
        assert schemes[hf]["num_bits"] == bits and schemes[hf]["group_size"] == group
        assert torch.equal(_decode(tmp_path / "ct", hf, schemes[hf]), w.signed()[order].long())
        assert torch.equal(tensors[f"{hf}.weight_scale"], w.scale[order])


@pytest.mark.parametrize("method, bits, group, symmetric, grid", SCHEMES)
def test_compressed_tensors_decompressor_gives_our_weights_exactly(arch, method, bits, group, symmetric, grid,
                                                                   tmp_path):
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    qmodel = _quantized(arch, method, bits, group, symmetric, grid)
    save_compressed(qmodel, tmp_path / "ct")
    config = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    schemes = {name: g["weights"] for g in config["config_groups"].values() for name in g["targets"]}
    tensors = load_file(str(tmp_path / "ct" / "model.safetensors"))
    rows, checked = _row_maps(qmodel.config), 0
    for name in block_int_weights(qmodel):
        hf = hf_linear_name(name)
        if hf in config["ignore"]:
            continue
        scheme = QuantizationScheme(targets=[hf], weights=QuantizationArgs(**schemes[hf]))
        stored = {key: tensors[f"{hf}.{key}"] for key in ("weight_packed", "weight_scale", "weight_shape")}
        weight = PackedQuantizationCompressor.decompress(stored, scheme)["weight"]
        ours = qmodel.get_submodule(name).dequantized_weight()
        order = rows.get(name.rsplit(".", 1)[1], torch.arange(ours.shape[0]))
        assert torch.equal(weight, ours[order]), name
        checked += 1
    assert checked >= 5


def test_config_validates_in_compressed_tensors(tmp_path):
    ct = pytest.importorskip("compressed_tensors.quantization")
    save_compressed(_quantized("transformer", "gptq", 4, 16, True, "full"), tmp_path / "ct")
    data = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    parsed = ct.QuantizationConfig.model_validate(data)
    assert parsed.format == "pack-quantized" and parsed.quantization_status == "compressed"


@pytest.mark.parametrize("method, bits, group, symmetric, grid", SCHEMES)
def test_transformers_loads_the_folder_with_our_logits(arch, method, bits, group, symmetric, grid, tmp_path):
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    qmodel = _quantized(arch, method, bits, group, symmetric, grid)
    save_compressed(qmodel, tmp_path / "ct")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "ct", dtype=torch.float32).eval()
    ids = torch.randint(0, qmodel.config.vocab_size, (2, 24))
    with torch.no_grad():
        ours, theirs = qmodel(ids), hf(ids).logits
    assert float((ours - theirs).abs().max() / ours.abs().max()) < 1e-5


def test_dequantized_copy_computes_the_quantized_model():
    qmodel = _quantized("diff", "rtn", 4, 16, True, "absmax", tie_embeddings=True)
    ids = torch.randint(0, qmodel.config.vocab_size, (2, 12))
    with torch.no_grad():
        assert torch.equal(qmodel(ids), dequantized_copy(qmodel)(ids))


def test_activation_quantizers_are_refused_in_one_line(tmp_path):
    model = randomize_(build_model(tiny_config()))
    qmodel = quantize(model, QuantConfig(weights=WeightQuant("rtn", bits=4), activations=ActQuant(8, "token")))
    with pytest.raises(CheckpointError, match="quantized weights only") as info:
        save_compressed(qmodel, tmp_path / "ct")
    assert "\n" not in str(info.value) and not (tmp_path / "ct").exists()


def test_asymmetric_weights_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="asymmetric zero points"):
        save_compressed(_quantized("transformer", "rtn", 4, 16, False, None), tmp_path / "ct")


def test_ragged_groups_are_refused_in_one_line(tmp_path):
    """compressed-tensors' group forward needs the group size to divide the width; ours may end in a short group."""
    with pytest.raises(CheckpointError, match="24 does not divide 32") as info:
        save_compressed(_quantized("transformer", "rtn", 4, 24, True, "absmax"), tmp_path / "ct")
    assert "\n" not in str(info.value) and not (tmp_path / "ct").exists()


def test_float16_scales_that_would_round_are_refused(tmp_path):
    qmodel = _quantized("transformer", "rtn", 4, None, True, "absmax")
    with pytest.raises(CheckpointError, match="not exactly representable in torch.float16"):
        save_compressed(qmodel, tmp_path / "ct", dtype=torch.float16)


def test_cli_converts_a_packed_folder_instead_of_crashing(tmp_path, capsys):
    """`convert Q --to hf` of a packed checkpoint once died with a KeyError traceback."""
    qmodel = _quantized("transformer", "rtn", 4, 16, True, "absmax")
    save_quantized(qmodel, tmp_path / "q", dtype=torch.float16)
    assert main(["convert", str(tmp_path / "q"), str(tmp_path / "hf"), "--to", "hf"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["quantization"] == "compressed-tensors"
    packed = load_checkpoint(tmp_path / "q")
    tensors = load_file(str(tmp_path / "hf" / "model.safetensors"))
    scale = tensors["model.layers.0.mlp.up_proj.weight_scale"]
    assert scale.dtype == torch.float32 and torch.equal(scale, packed.layers[0].mlp.up_proj.scale)
