"""The signs of a pair's top-100 attention logits (the Table-5 profile records magnitudes and where they sit).

    nice python experiments/logit_signs.py xs-lr3e-3-s0-41.9M [PAIR ...]

For each pair of ``experiments/results/regime/pairs.json`` whose checkpoints are on disk, reruns the sequences that
hold its located top-100 logits (``table5/PAIR.json.gz``: layer, head, Diff map, query, key) through the eager path,
reads the signed logit at each location, checks its magnitude against the recorded one (1 %), and prints how many
are negative, which (layer, head, map) hold them, the median query − key distance, the median attention weight the
located key gets from its map's softmax row and, for Diff, the median logit of the other map at the same place.
Negative maxima are scores that suppress a key; an attention sink shows as large positive scores on one key (the
first, usually); large positive scores on nearby keys with a weight near 1 are a hard pointer.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

from diffquant.checkpoint import load_checkpoint
from diffquant.corpus import heldout_ids
from diffquant.io import read_json_file
from diffquant.study.table5 import profile_path
from diffquant.tokenizer import Tokenizer

REGIME = Path(__file__).resolve().parent / "results" / "regime"
TOKENIZER = Path(__file__).resolve().parent / "corpus" / "stories260k-s0" / "tokenizer.model"
SEQ_LEN = 512  # the verdicts' profile windows (experiments/campaign/verdicts.py)


def signed_values(model, ids: torch.Tensor, locations: list[dict]) -> list[dict]:
    """At each location (``sequence`` indexes windows of SEQ_LEN tokens): the signed attention logit, the weight
    its map's causal softmax row gives the key and, for Diff, the other map's logit there. Puts ``model`` in eval
    mode on the eager path (load one for this)."""
    model.eval().set_attn_impl("eager")
    captured: dict[int, torch.Tensor] = {}
    hooks = [layer.attn.logits.register_forward_hook(lambda m, args, out, i=i: captured.__setitem__(i, out.detach()))
             for i, layer in enumerate(model.layers)]
    try:
        return _read_locations(model, ids, locations, captured)
    finally:
        for hook in hooks:
            hook.remove()


def _read_locations(model, ids: torch.Tensor, locations: list[dict], captured: dict) -> list[dict]:
    """Runs each window holding a location and reads it from the logits the hooks put in ``captured``."""
    values = []
    with torch.no_grad():
        for seq in sorted({loc["sequence"] for loc in locations}):
            model(ids[seq * SEQ_LEN:(seq + 1) * SEQ_LEN][None])
            for loc in (loc for loc in locations if loc["sequence"] == seq):
                maps = captured[loc["layer"]][0][loc["head"]]  # (T, S), or (2, T, S) for Diff
                q, k = loc["query"], loc["key"]
                row = (maps[loc["map"]] if "map" in loc else maps)[q, :q + 1]
                value = float(row[k])
                if abs(abs(value) - loc["value"]) > 0.01 * loc["value"]:
                    raise SystemExit(f"location {loc} holds {value}, not ±{loc['value']}: windows differ")
                found = {"value": value, "weight": float(torch.softmax(row.double(), -1)[k]), "distance": q - k}
                if "map" in loc:
                    found["other_map"] = float(maps[1 - loc["map"]][q, k])
                values.append(found)
    return values


def summary(locations: list[dict], values: list[dict]) -> dict:
    """How many of the located logits are negative, where they sit and what they do to their softmax rows."""
    sites = Counter(f"L{loc['layer']} h{loc['head']}" + (f" map {loc['map'] + 1}" if "map" in loc else "")
                    for loc in locations)
    out = {"negative": sum(v["value"] < 0 for v in values), "of": len(values), "sites": dict(sites.most_common()),
           "median_distance": statistics.median(v["distance"] for v in values),
           "median_weight": statistics.median(v["weight"] for v in values)}
    if all("other_map" in v for v in values):
        out["median_other_map"] = statistics.median(v["other_map"] for v in values)
    return out


def main(names: list[str]) -> dict:
    torch.set_num_threads(1)
    ids = torch.as_tensor(heldout_ids(Tokenizer.load(TOKENIZER))).long()
    pairs = {p["pair"]: p for p in json.loads((REGIME / "pairs.json").read_text())}
    out = {}
    for name in names:
        table5 = read_json_file(profile_path(REGIME, name))
        for arch, path in pairs[name]["checkpoints"].items():
            if not Path(path).is_dir():
                print(f"{name} {arch}: no checkpoint at {path}")
                continue
            locations = table5[arch]["sites"]["attn_logits"]["locations"]
            found = out[f"{name}/{arch}"] = summary(locations, signed_values(load_checkpoint(path), ids, locations))
            print(f"{name} {arch}: {found['negative']} of {found['of']} negative; {json.dumps(found)}")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
