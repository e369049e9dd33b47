"""diffquant: do Differential Transformers have fewer activation outliers and survive low-bit quantization better?"""

import logging

from . import quant
from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from .config import ModelConfig
from .model import LM, build_model, num_params
from .probes import Probe, hooked, probes
from .profile import OutlierReport, profile
from .quant.api import quantize, quantize_
from .tokenizer import text_batches

__version__ = "0.1.0"
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "CheckpointError", "LM", "ModelConfig", "Probe", "build_model", "hooked", "load_checkpoint", "num_params",
    "OutlierReport", "probes", "profile", "quant", "quantize", "quantize_", "save_checkpoint",
    "text_batches",
]
