"""The llama.cpp experiment (experiments/llamacpp): runs only where its binding was built (setup.sh).

llama.cpp evaluating our F32 export must give our perplexity; on the block formats it quantizes activations to
8 bits in its dot products, so only closeness is asked there.
"""

from pathlib import Path

import pytest

from .helpers import load_script

HERE = Path(__file__).resolve().parents[1] / "experiments" / "llamacpp"
VENV_PYTHON = HERE / ".venv" / "bin" / "python"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not (HERE / ".venv" / "build.json").is_file(), reason="llama-cpp-python not built (experiments/llamacpp/setup.sh)")]


def test_llamacpp_perplexity_of_our_exports_matches_ours(tmp_path):
    compare = load_script(HERE / "compare.py")
    result = compare.run(n_windows=2, window=64, work=tmp_path)
    rows = result["rows"]
    assert set(rows) == {"f32", "q8_0-llamacpp", "q4_0-llamacpp", "q8_0-llama-quantize", "q4_0-llama-quantize",
                         "q8_0-rtn", "q4_0-rtn", "q4_0-gptq"}
    for name, row in rows.items():
        ours, theirs = row["ours"]["perplexity"], row["llama_cpp"]["perplexity"]
        assert row["ours"]["tokens"] == row["llama_cpp"]["tokens"] == 128
        assert abs(theirs - ours) / ours < (1e-4 if name == "f32" else 2e-2), name
    for name, agreement in result["llama_quantize_vs_gguf_quants"].items():  # llama.cpp's quantizer, our rounding
        assert agreement["tensors_compared"] > 0 and agreement["different"] == [], name
    assert rows["q4_0-llama-quantize"]["tensor_types"].get("Q4_0", 0) > 0
    assert "| f32.gguf |" in compare.markdown(result)
