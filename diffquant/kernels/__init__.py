"""Optional Triton kernels (``pip install triton``; on the CPU only under ``TRITON_INTERPRET=1``).

Nothing here is imported by the package unless a caller asks for it: ``available()`` tells whether Triton can be
imported, and the kernels' modules import it at their top.
"""

from __future__ import annotations

import functools
import importlib.util

__all__ = ["available"]


@functools.cache  # asked on every fused Diff attention call
def available() -> bool:
    """Whether Triton is installed (the kernels still need CUDA, or the interpreter, to run)."""
    return importlib.util.find_spec("triton") is not None
