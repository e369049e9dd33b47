"""llama.cpp's own quantizer on a GGUF file: ``llama_model_quantize``, the function the llama-quantize tool calls,
with its default tensor-type mixture for the file type; runs in experiments/llamacpp/.venv (llama-cpp-python).

Usage: python llamacpp_quantize.py SRC.gguf DST.gguf q8_0|q4_0
Standalone on purpose: no diffquant import.
"""

import ctypes
import sys

import llama_cpp

FILE_TYPES = {"q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0}


def main(argv: list[str]) -> None:
    if len(argv) != 3 or argv[2] not in FILE_TYPES:
        sys.exit("usage: llamacpp_quantize.py SRC.gguf DST.gguf q8_0|q4_0")
    src, dst, kind = argv
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[kind]
    params.nthread = 1
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params)) != 0:
        sys.exit(f"llama_model_quantize failed on {src}")


if __name__ == "__main__":
    main(sys.argv[1:])
