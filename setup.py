"""Build hook: a wheel carries the data an installed package needs, in the repository's layout under
``diffquant/_data/`` (``diffquant.data.calib_dir`` looks there first).

What it carries is read from data, not listed here: every file of ``calib/``, and for each pair of
``calib/models/pairs.json`` marked ``"packaged": true`` its two checkpoint folders with their run's
``train_log.json`` (the demo reads the training context and tokens from it). The registry's relative paths then
resolve inside the package as they do in the repository. Editable installs read the repository itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
DATA = Path("diffquant") / "_data"  # inside the built package
REGISTRY = Path("calib") / "models" / "pairs.json"


def packaged_files() -> list[Path]:
    """Repository-relative paths: calib/ and the packaged pairs' checkpoint folders and train logs."""
    files = [p.relative_to(ROOT) for p in sorted((ROOT / "calib").rglob("*")) if p.is_file()]
    registry = json.loads((ROOT / REGISTRY).read_text(encoding="utf-8"))
    for name, entry in registry.get("pairs", {}).items():
        if entry.get("packaged"):
            for arch in ("transformer", "diff"):
                files += checkpoint_files(name, (ROOT / REGISTRY).parent / entry[arch]["path"])
    return files


def checkpoint_files(pair: str, folder: Path) -> list[Path]:
    folder = folder.resolve()
    if not folder.is_relative_to(ROOT) or not (folder / "model.safetensors").is_file():
        raise SystemExit(f"{REGISTRY}: packaged pair {pair!r} needs its checkpoint inside the repository: {folder}")
    found = [p for p in sorted(folder.iterdir()) if p.is_file()]
    log = folder.parent / "train_log.json"
    return [p.relative_to(ROOT) for p in found + ([log] if log.is_file() else [])]


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        for rel in packaged_files():
            target = Path(self.build_lib) / DATA / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, target)


class SdistWithData(sdist):
    def make_release_tree(self, base_dir, files) -> None:
        super().make_release_tree(base_dir, files)
        for rel in packaged_files():
            target = Path(base_dir) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / rel, target)


if __name__ == "__main__":  # setuptools runs the file as __main__; tests import it for packaged_files
    setup(cmdclass={"build_py": BuildWithData, "sdist": SdistWithData})
