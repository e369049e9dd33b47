"""Models larger than one device: a forced offload (max_memory below the model's size) changes no result."""

import json

import pytest
import torch

import diffquant as dq
from diffquant.checkpoint.hf import save_hf
from diffquant.cli import main
from diffquant.data import documents
from diffquant.dispatch import input_device, is_offloaded
from diffquant.errors import UserError
from diffquant.evaluate import rolling_perplexity
from diffquant.hf_probes import HFProbed, load_hf_model
from diffquant.offload import for_rank, load_dispatched, parse_max_memory
from diffquant.quant import ActQuant, QuantConfig, WeightQuant
from diffquant.quant.api import iter_quantized
from diffquant.tokenizer import default_tokenizer

from .conftest import tiny_config
from .helpers import randomize_

pytest.importorskip("accelerate")


@pytest.fixture(scope="module", params=["transformer", "diff"])
def folder(request, tmp_path_factory):
    torch.manual_seed(0)
    model = randomize_(dq.build_model(tiny_config(request.param, n_layers=4, max_seq_len=32, vocab_size=8192)))
    path = save_hf(model, tmp_path_factory.mktemp("hf") / request.param, tokenizer=default_tokenizer())
    return path, sum(p.numel() * 4 for p in model.parameters())


@pytest.fixture(scope="module")
def models(folder):
    path, size = folder
    full = HFProbed(load_hf_model(path))
    offloaded = load_dispatched(path, "auto", max_memory={"cpu": int(size * 0.9)})  # the blocks go to disk
    return full, offloaded


def _batches(n=3):
    return list(torch.randint(0, 8192, (2 * n, 32), generator=torch.Generator().manual_seed(1)).split(2))


def test_the_budget_forces_disk_offload(models):
    placement = set(models[1].hf.hf_device_map.values())
    assert {"cpu", "disk"} <= placement
    offloaded = [m for m in models[1].modules() if is_offloaded(m)]
    assert offloaded and all(m.weight.device.type == "meta" for m in offloaded if hasattr(m, "weight"))
    assert input_device(models[1]).type == "cpu"


def test_offloaded_profile_equals_in_memory(models):
    full, offloaded = models
    kw = dict(topk=20, progress=False)
    assert dq.profile(offloaded, _batches(), **kw).to_json() == dq.profile(full, _batches(), **kw).to_json()


def test_offloaded_logit_quantized_perplexity_equals_in_memory(models):
    ids = torch.randint(0, 8192, (200,), generator=torch.Generator().manual_seed(2))
    qc = QuantConfig(logits=ActQuant(4))
    full, offloaded = (rolling_perplexity(dq.quantize(m, qc), ids, progress=False) for m in models)
    assert offloaded == full


def test_gptq_with_offload_equals_gptq_in_memory(models):
    qc = QuantConfig(weights=WeightQuant("gptq", 4, group_size=16))
    full, offloaded = (dq.quantize(m, qc, calib=_batches(2)) for m in models)
    x = _batches(1)[0]
    assert torch.equal(offloaded(x), full(x))
    q_full = dict(iter_quantized(full))
    q_off = dict(iter_quantized(offloaded))
    assert q_full.keys() == q_off.keys() and len(q_full) == 4 * 7
    assert any(is_offloaded(m) for m in q_off.values())
    for name, module in q_off.items():
        # offloaded blocks were written back to the offload: meta between forwards, equal codes when loaded
        if is_offloaded(module):
            assert module.qweight.device.type == "meta"
            module._hf_hook.pre_forward(module)
        assert torch.equal(module.qweight, q_full[name].qweight) and torch.equal(module.scale, q_full[name].scale)


def test_max_memory_gpu_indices_are_per_rank():
    budget = {0: "75GiB", 1: "75GiB", "cpu": "200GiB"}
    assert for_rank(budget, 0) == budget
    assert for_rank(budget, 3) == {6: "75GiB", 7: "75GiB", "cpu": "200GiB"}


def test_max_memory_parsing():
    assert parse_max_memory("0=20GiB, 1=20GiB,cpu=64GiB") == {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}
    for bad in ("cpu", "gpu=1GiB", "0=lots", ""):
        with pytest.raises(UserError):
            parse_max_memory(bad)


def test_cli_profile_with_device_map(folder, tmp_path, capsys):
    path, size = folder
    text = tmp_path / "t.txt"
    text.write_text(documents("tinyshakespeare")[0].text[:800])
    common = ["profile", str(path), "--data", str(text), "--tokens", "128", "--seq-len", "32", "--topk", "10"]
    assert main([*common, "--json", str(tmp_path / "a.json")]) == 0
    assert main([*common, "--device-map", "auto", "--max-memory", f"cpu={int(size * 0.9)}", "--offload-folder",
                 str(tmp_path / "off"), "--json", str(tmp_path / "b.json")]) == 0
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a == b
    capsys.readouterr()
    assert main([*common, "--max-memory", "cpu=1GiB"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == ["diffquant: error: --max-memory and --offload-folder "
                                                           "need --device-map"]


def test_sweep_with_offload_equals_sweep_in_memory(folder, tmp_path):
    from diffquant.records import read_records
    from diffquant.sweep import run_sweep

    path, size = folder
    kw = dict(target="attn_logits", bits=[16, 4], tasks=["copa"], limit=3, progress=False)
    for name, where in (("memory", {"device_map": {"": "cpu"}}),
                        ("offload", {"device_map": "auto", "max_memory": {"cpu": int(size * 0.9)}})):
        run_sweep([str(path)], tmp_path / f"{name}.jsonl", dispatch={**where, "offload_folder": None}, **kw)
    memory, offload = (read_records(tmp_path / f"{n}.jsonl") for n in ("memory", "offload"))
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("wall_time_s", "quantize_s", "created")}
                        for r in rs]
    assert len(memory) == 2 and strip(offload) == strip(memory)
