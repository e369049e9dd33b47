"""Triton kernels run on the GPU where there is one, else on the CPU through Triton's interpreter (the switch must
be set before the kernels are defined). Tests move the kernels' inputs to ``DEVICE``."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
