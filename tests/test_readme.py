"""The README's Python blocks run as written (in a scratch folder that sees the repository's data)."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", (REPO / "README.md").read_text(encoding="utf-8"), re.M | re.S)


def test_the_readme_has_python_blocks():
    assert python_blocks()


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_python_block_runs_as_written(index, tmp_path, monkeypatch):
    for name in ("experiments", "calib"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)  # outputs (profile.json, ...) land here, not in the repository
    namespace = {"__name__": "__readme__"}
    exec(compile(python_blocks()[index], f"README.md python block {index}", "exec"), namespace)
    if "seen" in namespace:  # the hooked() example: logit probes fired on a checkpoint saved with sdpa
        assert namespace["model"].config.attn_impl == "sdpa"
        assert len(namespace["seen"]) == namespace["model"].config.n_layers
