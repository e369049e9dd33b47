"""Table 5 of a pair: every arm profiled on the same held-out windows, where the top values sit, the tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..arches import ArchColumn
from ..checkpoint import load_checkpoint
from ..io import atomic_write_text, compact_json_object, compressed_name
from ..kinds import ATTN_LOGITS, HIDDEN
from ..profile import profile, token_batches
from ..tables import outlier_table, ratio_table, render
from ..tracking import diff_lambdas
from .cells import fmt

LOCATED = 100  # top values whose positions are summarised


def profile_path(out: Path, name: str) -> Path:
    """Where a pair's Table-5 profile lives under an output folder: ``out/table5/NAME.json.gz`` (a fifth of the
    plain size), or an older output's plain ``NAME.json`` where only that exists."""
    return compressed_name(Path(out) / "table5" / f"{name}.json")


def profile_pair(pair: dict, ids: np.ndarray, seq_len: int, batch_size: int, max_tokens: int | None = None,
                 device: str = "cpu", out: Path | None = None) -> dict[str, dict]:
    """Table-5 records of every arm on ``ids`` (global protocol, exact medians, top-100 located)."""
    records = {}
    batches = token_batches(ids, seq_len, batch_size, max_tokens)  # the same windows for every arm
    for arch, path in pair["checkpoints"].items():
        model = load_checkpoint(path, device=device)
        report = profile(model, batches, label=f"{pair['pair']}-{arch}", exact_median=True, n_locations=LOCATED,
                         progress=False)
        records[arch] = {**report.data, "train_tokens": pair["tokens"], "lambda": diff_lambdas(model)}
    if out is not None:
        atomic_write_text(Path(out), compact_json_object(records))  # one line per arm: ~35% smaller than indented
    return records


def top1(record: dict, kind: str) -> float:
    """An arm's largest |value| at probe kind ``kind`` from its Table-5 record."""
    return record["sites"][kind]["top"][0]


def top_sites(site: dict) -> dict:
    """Where the located top values sit: the share whose key (or position) is the first token, and for Diff
    logits the share in the second map (Q2K2ᵀ)."""
    locs = site.get("locations", [])
    if not locs:
        return {"n": 0}
    first = [loc.get("key", loc.get("position")) == 0 for loc in locs]
    out = {"n": len(locs), "first_token": sum(first) / len(locs),
           "layers": sorted({loc["layer"] for loc in locs})}
    if "map" in locs[0]:
        out["second_map"] = sum(loc["map"] == 1 for loc in locs) / len(locs)
    return out


def sites_table(results: list[dict]) -> str:
    """Where the top-100 logits and hidden values sit, per pair and arm."""
    rows = []
    for r in results:
        for arch, sites in r["top_sites"].items():
            logit, hidden = sites[ATTN_LOGITS], sites[HIDDEN]
            rows.append([r["pair"], arch, fmt(logit.get("first_token"), 2), fmt(logit.get("second_map"), 2),
                         ",".join(map(str, logit.get("layers", []))), fmt(hidden.get("first_token"), 2),
                         ",".join(map(str, hidden.get("layers", [])))])
    header = ["pair", "arm", "logits: key = first token", "logits: Diff map 2", "logits: layers",
              "hidden: first token", "hidden: layers"]
    return render(header, rows)


def table5_text(table5: dict[str, dict]) -> str:
    """Markdown: per pair, the outlier table of its arms and each other arm's ratios to the Transformer."""
    parts = []
    for name, recs in table5.items():
        parts += [f"### {name}", "", outlier_table({r["label"]: r for r in recs.values()}, paper=True), ""]
        for arch, rec in recs.items():
            if arch != "transformer":
                ratios = ratio_table(recs["transformer"], rec, other_label=ArchColumn("label")[arch],
                                     paper=arch == "diff")
                parts += [ratios, ""]
    return "\n".join(parts)
