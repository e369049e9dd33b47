import json

import pytest
import torch

from diffquant import build_model, hooked, probes
from diffquant.profile import OutlierReport, profile, token_batches
from diffquant.tables import outlier_table, ratio_table

from .conftest import tiny_config
from .helpers import randomize_


@pytest.fixture
def model(arch):
    return randomize_(build_model(tiny_config(arch, n_kv_heads=2))).eval()


def batches(n_seq=6, T=24, B=3, vocab=101):
    return token_batches(torch.randint(0, vocab, (n_seq * T,)), T, B)


def collect_all(model, data, kind):
    """Independent reference: every counted |value| of a probe kind, plus its layer, in one flat tensor."""
    values = []

    def grab(name, probe, x, call):
        mask = probe.causal_mask(x, call.q_offset)
        keep = torch.ones_like(x, dtype=torch.bool) if mask is None else mask.expand_as(x)
        values.append(x.detach()[keep].abs())

    with torch.no_grad(), hooked(model, grab, kinds=kind):
        for ids in data:
            model(ids)
    return torch.cat(values)


@pytest.mark.parametrize("kind", ["attn_logits", "hidden"])
def test_global_topk_and_median_equal_torch_over_everything(model, kind):
    data = batches()
    ref = collect_all(model, data, kind)
    report = profile(model, data, sites=(kind,), topk=100, progress=False)
    site = report.sites[kind]
    assert site["top"] == torch.topk(ref, 100).values.double().tolist()
    assert site["count"] == ref.numel()
    true_median = torch.median(ref).item()
    assert abs(site["median"] - true_median) <= 2 ** -8 * true_median
    exact = profile(model, data, sites=(kind,), topk=5, exact_median=True, progress=False).sites[kind]
    assert exact["median"] == true_median and exact["quantiles_exact"]


def test_masked_logits_never_count(model):
    data = batches()

    def plant(name, probe, x, call):
        return x.masked_fill(~probe.causal_mask(x, call.q_offset), 1e6)

    with torch.no_grad():
        base = [model(ids) for ids in data]
    with hooked(model, plant, kinds="attn_logits"):
        report = profile(model, data, sites=("attn_logits",), progress=False)
        with torch.no_grad():
            planted = [model(ids) for ids in data]
    assert max(report.sites["attn_logits"]["top"]) < 1e5
    assert all(torch.equal(a, b) for a, b in zip(base, planted, strict=True))


def test_profiling_leaves_outputs_and_settings_unchanged(model):
    model.set_attn_impl("sdpa")
    data = batches()
    with torch.no_grad():
        before = [model(ids) for ids in data]
    profile(model, data, chunk=5, progress=False)
    with torch.no_grad():
        after = [model(ids) for ids in data]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert all(block.attn.impl == "sdpa" and block.attn.chunk is None for block in model.layers)


def test_hooks_removed_and_impl_restored_on_error(model):
    bad = [torch.full((2, 8), 10_000)]  # out-of-vocabulary ids raise inside the forward
    with pytest.raises(ValueError, match="token ids"):
        profile(model, bad, progress=False)
    assert all(not p._forward_hooks for p in probes(model).values())


def test_chunked_profile_equals_unchunked(model):
    data = batches(T=30)
    a = profile(model, data, topk=50, progress=False).data
    b = profile(model, data, topk=50, chunk=7, progress=False).data
    for kind in ("attn_logits", "hidden"):
        assert a["sites"][kind]["count"] == b["sites"][kind]["count"]
        assert a["sites"][kind]["top"] == pytest.approx(b["sites"][kind]["top"], rel=1e-6)
        assert a["sites"][kind]["median"] == pytest.approx(b["sites"][kind]["median"], rel=1e-3)
    la, lb = a["sites"]["attn_logits"]["locations"][0], b["sites"]["attn_logits"]["locations"][0]
    assert {k: v for k, v in la.items() if k != "value"} == {k: v for k, v in lb.items() if k != "value"}


def test_top_locations_point_at_the_values(model, arch):
    data = batches()
    report = profile(model, data, progress=False)
    captured = {}

    def keep(name, probe, x, call):
        captured.setdefault(name, []).append(x.detach().clone())

    with torch.no_grad(), hooked(model, keep, kinds=("attn_logits", "hidden")):
        for ids in data:
            model(ids)
    B = data[0].shape[0]
    for loc in report.sites["attn_logits"]["locations"][:5]:
        x = captured[f"layers.{loc['layer']}.attn.logits"][loc["sequence"] // B][loc["sequence"] % B]
        head = x[loc["head"], loc["map"]] if arch == "diff" else x[loc["head"]]
        assert loc["key"] <= loc["query"]
        assert abs(head[loc["query"], loc["key"]].item()) == loc["value"]
    ids = torch.cat(data)
    for loc in report.sites["hidden"]["locations"][:5]:
        x = captured[f"layers.{loc['layer']}.out"][loc["sequence"] // B][loc["sequence"] % B]
        assert abs(x[loc["position"], loc["channel"]].item()) == loc["value"]
        assert loc["token_id"] == ids[loc["sequence"], loc["position"]].item()


def test_per_sequence_protocol_equals_naive(model):
    data = batches()
    report = profile(model, data, topk=10, protocol="per_sequence", progress=False)
    tops, medians = [], []
    for ids in data:
        for b in range(ids.shape[0]):
            vals = collect_all(model, [ids[b:b + 1]], "attn_logits")
            tops.append(torch.topk(vals, 10).values.double())
            medians.append(torch.median(vals).item())
    got = report.sites["attn_logits"]["per_sequence"]
    assert got["top"] == pytest.approx(torch.stack(tops).mean(0).tolist(), rel=1e-12)
    assert got["median"] == pytest.approx(sum(medians) / len(medians), rel=2 ** -8)


def test_per_layer_results_and_nonfinite_counts(model):
    data = batches()

    def poison(name, probe, x, call):
        if name == "layers.1.out":
            x = x.clone()
            x[0, 0, 0], x[0, 1, 1] = float("nan"), float("inf")
            return x

    with hooked(model, poison, kinds="hidden"):
        report = profile(model, data, progress=False)
    hidden = report.data["layers"][1]["hidden"]
    assert hidden["nan"] == len(data) and hidden["inf"] == len(data)
    assert report.data["layers"][0]["hidden"]["nan"] == 0
    assert all(v < float("inf") for v in report.sites["hidden"]["top"])
    assert report.sites["hidden"]["nan"] == len(data)


def test_report_json_round_trip_and_tables(model, tmp_path):
    report = profile(model, batches(), label="m", progress=False)
    path = tmp_path / "r.json"
    report.to_json(path)
    data = json.loads(path.read_text())
    assert data["tokens"] == 6 * 24 and set(data["sites"]) == {"attn_logits", "hidden"}
    assert len(data["sites"]["attn_logits"]["top"]) == 100 and len(data["layers"]) == 2
    again = OutlierReport.from_json(path)
    for fmt in ("markdown", "csv", "latex"):
        text = again.table(fmt)
        assert "attention logits" in text and "hidden states" in text
    side = ratio_table(data, data, fmt="markdown")
    assert "Transformer/Diff" in side and "paper 3B ratio" in side
    assert "paper 3B" in outlier_table({"m": data}, paper=True)
    with pytest.raises(ValueError, match="unknown table format"):
        outlier_table({"m": data}, fmt="html")


def test_bad_arguments(model):
    with pytest.raises(ValueError, match="unknown protocol"):
        profile(model, batches(), protocol="mean")
    with pytest.raises(ValueError, match="batch list is empty"):
        profile(model, [])
    with pytest.raises(ValueError, match="no probes of kinds"):
        profile(model, batches(), sites=("nonsense",))
    with pytest.raises(ValueError, match="fewer than one window"):
        token_batches(torch.arange(5), 8, 2)
