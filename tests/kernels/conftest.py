"""Triton kernels run on the CPU through Triton's interpreter; the switch must be set before they are defined."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
