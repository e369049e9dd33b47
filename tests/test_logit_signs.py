"""experiments/logit_signs.py: the signed logit at each located top value, the weight its causal softmax row gives
the key, the other Diff map's logit there, and the summary over locations."""

import pytest
import torch

from diffquant import build_model

from .conftest import tiny_config
from .helpers import load_script, randomize_
from .test_experiments_index import EXPERIMENTS

signs = load_script(EXPERIMENTS / "logit_signs.py")


def eager_logits(model, window):
    """Every layer's attention logits for one window: (heads, [2,] T, T) per layer."""
    captured = {}
    hooks = [layer.attn.logits.register_forward_hook(lambda m, a, out, i=i: captured.__setitem__(i, out[0].clone()))
             for i, layer in enumerate(model.layers)]
    with torch.no_grad():
        model(window[None])
    for hook in hooks:
        hook.remove()
    return captured


def test_located_diff_logits_are_read_with_their_weight_and_the_other_map(monkeypatch):
    torch.manual_seed(3)
    monkeypatch.setattr(signs, "SEQ_LEN", 16)
    model = randomize_(build_model(tiny_config("diff"))).eval()
    model.set_attn_impl("eager")
    ids = torch.randint(0, 101, (3 * 16,))
    window = 2
    maps = eager_logits(model, ids[window * 16:(window + 1) * 16])
    causal = torch.ones(16, 16).tril().bool()
    locations = []
    for layer, head, map_ in [(0, 1, 0), (1, 1, 1), (1, 0, 0)]:  # tiny Diff: 2 heads
        grid = maps[layer][head][map_].masked_fill(~causal, 0).abs()
        query, key = divmod(int(grid.argmax()), 16)
        locations.append({"sequence": window, "layer": layer, "head": head, "map": map_, "query": query,
                          "key": key, "value": float(grid[query, key])})
    found = signs.signed_values(model, ids, locations)
    for loc, got in zip(locations, found, strict=True):
        row = maps[loc["layer"]][loc["head"]][loc["map"]][loc["query"], :loc["query"] + 1].double()
        assert abs(got["value"]) == loc["value"] and got["distance"] == loc["query"] - loc["key"]
        assert abs(got["weight"] - float(torch.exp(row[loc["key"]] - torch.logsumexp(row, 0)))) < 1e-12
        assert got["other_map"] == float(maps[loc["layer"]][loc["head"]][1 - loc["map"]][loc["query"], loc["key"]])


def test_a_location_that_does_not_hold_its_recorded_value_stops_the_run(monkeypatch):
    monkeypatch.setattr(signs, "SEQ_LEN", 16)
    model = randomize_(build_model(tiny_config("transformer"))).eval()
    bad = [{"sequence": 0, "layer": 0, "head": 0, "query": 5, "key": 2, "value": 1e6}]
    with pytest.raises(SystemExit, match="windows differ"):
        signs.signed_values(model, torch.randint(0, 101, (16,)), bad)


def test_the_summary_counts_signs_sites_and_medians():
    locations = [{"layer": 1, "head": 0, "map": 0}] * 3 + [{"layer": 2, "head": 5, "map": 1}]
    rows = [(9.0, 0.9, 3, -1.0), (-8.0, 1e-9, 200, 2.0), (7.5, 0.5, 11, -3.0), (-7.0, 0.1, 40, 4.0)]
    values = [{"value": v, "weight": w, "distance": d, "other_map": o} for v, w, d, o in rows]
    assert signs.summary(locations, values) == {
        "negative": 2, "of": 4, "sites": {"L1 h0 map 1": 3, "L2 h5 map 2": 1}, "median_distance": 25.5,
        "median_weight": 0.3, "median_other_map": 0.5}
    transformer = signs.summary([{"layer": 0, "head": 2}], [{"value": -3.0, "weight": 0.2, "distance": 7}])
    assert transformer["sites"] == {"L0 h2": 1} and "median_other_map" not in transformer
