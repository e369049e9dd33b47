"""Helpers shared by the test modules (fixtures live in conftest.py)."""

import torch


def randomize_(model):
    """Non-trivial values everywhere the init leaves constants: norm weights around 1, everything else (λ vectors
    included, large enough to matter) 0.3·N(0, 1). In place; returns the model."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            norm = name.endswith("norm.weight") or "subln" in name
            param.copy_(1 + 0.5 * torch.randn_like(param) if norm else 0.3 * torch.randn_like(param))
    return model


def randomize_hf_(model):
    """Non-trivial HF weights: norms around 1, everything else (λ vectors included) 0.3·N(0, 1); eval mode."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.5 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
    return model.eval()
