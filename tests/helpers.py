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


def load_script(path):
    """Import a script (e.g. under experiments/) by path, as a module named after its file."""
    import importlib.util
    import sys
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script loads
    spec.loader.exec_module(module)
    return module


# ---- GPTQ references (tests/quant): float64, column by column, the explicit inverse Hessian


def correlated_inputs(n, d, rank=4, noise=0.05):
    """Inputs living mostly in a few directions with very different scales: where GPTQ beats RTN."""
    basis = torch.randn(rank, d, dtype=torch.float64) * torch.logspace(1, -1, rank, dtype=torch.float64)[:, None]
    return torch.randn(n, rank, dtype=torch.float64) @ basis + noise * torch.randn(n, d, dtype=torch.float64)


def hessian(X):
    return 2 * X.T @ X / X.shape[0]


def gptq_reference_start(W, H, act_order=False, damp=0.01):
    """The references' common start: dead inputs zeroed, columns ordered (act-order: by Hessian diagonal), damped
    inverse Hessian in that order. Returns (W in that order, float64 copy; Hinv; order)."""
    W, H = W.double().clone(), H.double().clone()
    cols = W.shape[1]
    dead = torch.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    order = torch.argsort(torch.diag(H), descending=True, stable=True) if act_order else torch.arange(cols)
    H += damp * torch.diag(H).mean() * torch.eye(cols, dtype=H.dtype)
    return W[:, order], torch.linalg.inv(H)[order][:, order], order
