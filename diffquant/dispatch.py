"""Living with accelerate's big-model dispatch: where inputs go, and reaching offloaded weights.

A model loaded with a ``device_map`` (:mod:`diffquant.offload`) keeps offloaded weights on the ``meta`` device
between forwards; accelerate's hooks (``module._hf_hook``) load them onto the execution device for each forward
and drop them afterwards. Our forward hooks and probe swaps coexist with those hooks unchanged; only code that
reads a weight outside a forward (GPTQ) or picks the input device needs the helpers here. accelerate is imported
only for dispatched models, so this module costs nothing otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


def input_device(model: nn.Module) -> torch.device:
    """Where to put input ids: the first parameter's device, or the CPU when it is offloaded (``meta``); a
    dispatched model's hooks move inputs to each module's execution device themselves."""
    param = next(model.parameters(), None)
    if param is None or param.device.type == "meta":
        return torch.device("cpu")
    return param.device


def is_offloaded(module: nn.Module) -> bool:
    """The module's own tensors live in accelerate's offload (CPU or disk), not on its execution device."""
    hook = getattr(module, "_hf_hook", None)
    return bool(getattr(hook, "offload", False))


@contextmanager
def resident(module: nn.Module) -> Iterator[None]:
    """An offloaded module's weights loaded onto its execution device for the duration (then dropped again)."""
    if not is_offloaded(module):
        yield
        return
    from accelerate.utils import align_module_device

    with align_module_device(module):
        yield


def place_like(new: nn.Module, old: nn.Module) -> nn.Module:
    """Put ``new`` (built from ``old``, e.g. its quantized replacement) where ``old`` lived: unchanged for an
    undispatched module; for a dispatched one, behind an accelerate hook on the same execution device, and for an
    offloaded one with its tensors written back to the offload (CPU memory) and off the device between forwards."""
    hook = getattr(old, "_hf_hook", None)
    if hook is None:
        return new
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    class _Offloaded(AlignDevicesHook):
        def post_forward(self, module, output):
            if hasattr(module, "clear_cache"):  # a cached dequantized weight would stay resident
                module.clear_cache()
            return super().post_forward(module, output)

    if is_offloaded(old):
        state = {n: t.detach().to("cpu") for n, t in [*new.named_parameters(), *new.named_buffers()]}
        add_hook_to_module(new, _Offloaded(execution_device=hook.execution_device, offload=True,
                                           offload_buffers=True, weights_map=state))
    else:
        add_hook_to_module(new, AlignDevicesHook(execution_device=hook.execution_device,
                                                 io_same_device=hook.io_same_device))
    return new
