import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from diffquant import CheckpointError, build_model, load_checkpoint, save_checkpoint
from diffquant.checkpoint import read_metadata

from .conftest import tiny_config
from .helpers import randomize_


@pytest.fixture
def saved(tmp_path, tiny):
    model = randomize_(build_model(tiny)).eval()
    path = save_checkpoint(model, tmp_path / "ckpt", metadata={"note": "unit test"})
    return model, path


def test_round_trip_is_bit_exact(saved):
    model, path = saved
    loaded = load_checkpoint(path)
    assert loaded.config == model.config
    for (n1, t1), (n2, t2) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert n1 == n2 and torch.equal(t1, t2)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(model(ids), loaded(ids))
    assert read_metadata(path)["note"] == "unit test"


def test_tied_head_is_stored_once(saved):
    _, path = saved
    assert "head.weight" not in load_file(str(path / "model.safetensors"))
    loaded = load_checkpoint(path)
    assert loaded.head.weight is loaded.embed.weight


def test_untied_model_round_trips(tmp_path):
    model = build_model(tiny_config("diff", tie_embeddings=False))
    loaded = load_checkpoint(save_checkpoint(model, tmp_path / "u"))
    assert torch.equal(loaded.head.weight, model.head.weight)
    assert loaded.head.weight.data_ptr() != loaded.embed.weight.data_ptr()


def test_fp16_save_and_attn_impl_override(tmp_path, tiny):
    model = build_model(tiny)
    path = save_checkpoint(model, tmp_path / "h", dtype=torch.float16)
    assert load_file(str(path / "model.safetensors"))["embed.weight"].dtype == torch.float16
    loaded = load_checkpoint(path, attn_impl="sdpa")
    assert loaded.config.attn_impl == "sdpa" and loaded.embed.weight.dtype == torch.float32


def test_refuses_to_overwrite_unless_asked(saved):
    model, path = saved
    before = (path / "model.safetensors").read_bytes()
    with pytest.raises(CheckpointError, match="not empty"):
        save_checkpoint(model, path)
    assert (path / "model.safetensors").read_bytes() == before
    save_checkpoint(model, path, overwrite=True)
    assert sorted(p.name for p in path.parent.iterdir()) == ["ckpt"]  # no temporary folders left


def test_failed_save_leaves_no_trace(tmp_path, tiny, monkeypatch):
    import diffquant.checkpoint.native as ck

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ck, "write_safetensors", broken)
    with pytest.raises(OSError):
        save_checkpoint(build_model(tiny), tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def _one_line(exc_info):
    assert "\n" not in str(exc_info.value)
    return str(exc_info.value)


def test_missing_folder_and_files(tmp_path, saved):
    _, path = saved
    with pytest.raises(CheckpointError, match="does not exist") as e:
        load_checkpoint(tmp_path / "nope")
    _one_line(e)
    (path / "config.json").rename(path / "c.bak")
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_checkpoint(path)
    (path / "c.bak").rename(path / "config.json")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="has no model.safetensors"):
        load_checkpoint(path)


def test_truncated_and_garbage_weights(saved):
    _, path = saved
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="corrupt or truncated") as e:
        load_checkpoint(path)
    _one_line(e)
    weights.write_bytes(b"\x00garbage" * 10)
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        load_checkpoint(path)


def test_config_that_does_not_match_the_tensors(saved):
    _, path = saved
    cfg = json.loads((path / "config.json").read_text())
    cfg["d_model"] = 64
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="does not match the weights") as e:
        load_checkpoint(path)
    _one_line(e)
    cfg["d_model"] = 32
    cfg["n_layers"] = 3
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="missing layers.2"):
        load_checkpoint(path)


def test_unknown_arch_and_bad_json(saved):
    _, path = saved
    cfg = json.loads((path / "config.json").read_text())
    cfg["arch"] = "rwkv"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unknown arch 'rwkv'"):
        load_checkpoint(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(path)


def test_nan_weights_are_refused(saved):
    _, path = saved
    tensors = load_file(str(path / "model.safetensors"))
    tensors["norm.weight"][3] = float("nan")
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="norm.weight contains NaN"):
        load_checkpoint(path)
