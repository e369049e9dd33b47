"""bitsandbytes adapter: LLM.int8 (with its outlier threshold), NF4 and FP4 Linear layers.

bitsandbytes is an optional extra (``pip install 'diffquant[bnb]'``), imported lazily. CPU traps handled here
(bitsandbytes 0.50, see docs/ARCHITECTURE.md):

* quantization happens when a parameter is moved to a device (``.to``), so modules are built on CPU and moved
  once, explicitly, here — never as a side effect elsewhere;
* Linear4bit repacks its weight in place for AVX512-BF16 kernels on its first CPU eval forward, which changes
  the layout between calls and machines: we switch that off (``support_avx512bf16_for_cpu = False``);
* LLM.int8's inference path needs eval mode: new layers are created in eval mode (``model.train()`` would flip
  them back; keep quantized models in eval).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from diffquant.quant.config import WeightQuant

log = logging.getLogger(__name__)

__all__ = ["bnb_empty_module", "bnb_quantize_", "bnb_scheme", "import_bnb"]

INSTALL_HINT = "pip install 'diffquant[bnb]'"


def import_bnb():
    """The bitsandbytes module, or a one-line error naming the extra to install."""
    try:
        import bitsandbytes
    except ImportError as exc:
        raise RuntimeError(f"bitsandbytes quantization needs the bnb extra: {INSTALL_HINT} ({exc})") from None
    _quiet_repeats(logging.getLogger("bitsandbytes.autograd._functions"))
    return bitsandbytes


class _OncePerMessage(logging.Filter):
    """LLM.int8 logs "inputs will be cast ... to float16" on every forward with float32 input: say it once."""

    def __init__(self):
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = record.getMessage()
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def _quiet_repeats(logger: logging.Logger) -> None:
    if not any(isinstance(f, _OncePerMessage) for f in logger.filters):
        logger.addFilter(_OncePerMessage())


def bnb_quantize_(model: nn.Module, names: list[str], wq: WeightQuant) -> None:
    """Replace the ``nn.Linear`` modules ``names`` of ``model`` by bitsandbytes layers quantized from their weights."""
    for name in names:
        linear = model.get_submodule(name)
        model.set_submodule(name, _from_linear(linear, wq))


def _from_linear(linear: nn.Linear, wq: WeightQuant) -> nn.Module:
    bnb = import_bnb()
    device = linear.weight.device
    weight = linear.weight.detach().to(torch.float32).cpu().clone()
    has_bias = linear.bias is not None
    if wq.method == "bnb-int8":
        new = bnb.nn.Linear8bitLt(linear.in_features, linear.out_features, bias=has_bias, has_fp16_weights=False,
                                  threshold=wq.threshold)
        new.weight = bnb.nn.Int8Params(weight, requires_grad=False, has_fp16_weights=False)
    else:
        quant_type = wq.method.removeprefix("bnb-")
        new = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=has_bias, quant_type=quant_type)
        new.weight = bnb.nn.Params4bit(weight, requires_grad=False, quant_type=quant_type, module=new)
        new.support_avx512bf16_for_cpu = False
    if has_bias:
        new.bias = nn.Parameter(linear.bias.detach().to(torch.float32).cpu().clone(), requires_grad=False)
    return new.to(device).eval()  # the move quantizes (bitsandbytes' design)


def bnb_scheme(module: nn.Module) -> dict:
    """What quant.json records for a bitsandbytes layer."""
    bnb = import_bnb()
    base = {"in_features": module.in_features, "out_features": module.out_features, "bias": module.bias is not None}
    if isinstance(module, bnb.nn.Linear8bitLt):
        return {"type": "bnb-int8", **base, "threshold": module.state.threshold}
    if isinstance(module, bnb.nn.Linear4bit):
        return {"type": f"bnb-{module.weight.quant_type}", **base, "blocksize": module.weight.blocksize,
                "compress_statistics": module.weight.compress_statistics}
    raise ValueError(f"cannot describe module type {type(module).__name__} in quant.json")


def bnb_empty_module(old: nn.Module, scheme: dict, state: dict[str, torch.Tensor], name: str) -> nn.Module:
    """A bitsandbytes layer ready to load its saved tensors (4-bit layers are rebuilt from them right here)."""
    bnb = import_bnb()
    kind, bias = scheme["type"], scheme["bias"]
    if kind == "bnb-int8":
        new = bnb.nn.Linear8bitLt(scheme["in_features"], scheme["out_features"], bias=bias, has_fp16_weights=False,
                                  threshold=scheme["threshold"])
        return new.to("cpu").eval()  # quantizes the random init so that load_state_dict can fill SCB
    if kind not in ("bnb-nf4", "bnb-fp4"):
        raise ValueError(f"unknown bitsandbytes module type {kind!r}")
    new = bnb.nn.Linear4bit(scheme["in_features"], scheme["out_features"], bias=bias,
                            quant_type=kind.removeprefix("bnb-"))
    prefix = f"{name}.weight."
    stats = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    new.weight = bnb.nn.Params4bit.from_prequantized(state[f"{name}.weight"], stats, requires_grad=False,
                                                     device="cpu", module=new)
    new.support_avx512bf16_for_cpu = False
    return new.eval()
