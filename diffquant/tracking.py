"""Outliers tracked during training: per layer, the top |attention logits| and |hidden states| on a fixed batch.

One eager forward over the same small batch every N steps, through :func:`diffquant.profile.profile` itself,
so a tracked point equals ``dq.profile`` on that batch. Per layer it keeps top-1, top-10 and the median of
each site (and the mean per-token kurtosis of hidden states), where the top-1 sits (head, Diff map, query and
key position, whether the key is the first token; position, channel and token for hidden states) and, for
Diff, the layer's λ.
"""

from __future__ import annotations

import torch
from torch import nn

from .kinds import ATTN_LOGITS, HIDDEN
from .profile import profile

TRACKED_SITES = (ATTN_LOGITS, HIDDEN)
TOPK = 10


def _site_point(stats: dict) -> dict:
    top = stats["top"]
    point = {"top1": top[0] if top else None, "top10": top[TOPK - 1] if len(top) >= TOPK else None,
             "median": stats["median"]}
    if "kurtosis" in stats:
        point["kurtosis"] = stats["kurtosis"]["mean"]
    loc = dict(stats["locations"][0]) if stats.get("locations") else {}
    loc.pop("value", None)
    loc.pop("layer", None)
    if "key" in loc:
        loc["first_token"] = loc["key"] == 0
    point["at"] = loc
    return point


@torch.no_grad()
def outlier_point(model: nn.Module, batch: torch.Tensor) -> list[dict]:
    """One tracked point: a dict per layer with ``attn_logits`` and ``hidden`` summaries (and ``lambda``)."""
    was_training = model.training
    model.eval()
    try:
        report = profile(model, [batch], sites=TRACKED_SITES, topk=TOPK, n_locations=1, progress=False)
    finally:
        model.train(was_training)
    lambdas = diff_lambdas(model)
    layers = []
    for entry in report.data["layers"]:
        point = {"layer": entry["layer"], **{site: _site_point(entry[site]) for site in TRACKED_SITES if site in entry}}
        if lambdas:
            point["lambda"] = lambdas[entry["layer"]]
            point["lambda_init"] = model.layers[entry["layer"]].attn.lambda_init
        layers.append(point)
    return layers


def diff_lambdas(model: nn.Module) -> list[float] | None:
    """Each layer's λ of a Diff model (λ < 0: the layer adds its second map instead of subtracting it), None for
    other models."""
    attns = [layer.attn for layer in getattr(model, "layers", []) if getattr(layer.attn, "is_diff", False)]
    return [float(attn.lambda_full().detach()) for attn in attns] or None

