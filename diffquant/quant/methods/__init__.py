"""The weight methods, one module each; importing this package registers them, in this order (the order of the
``--weights`` choices and of the sweep targets)."""
# isort: skip_file

from diffquant.quant.methods import rtn  # noqa: F401  (registration)
from diffquant.quant.methods import gptq  # noqa: F401
from diffquant.quant.methods import bnb  # noqa: F401
from diffquant.quant.methods import hadamard  # noqa: F401
