"""An installed wheel runs `diffquant demo`: setup.py's build hook packages calib/ and the registry's packaged
pairs in the repository's layout, so the registry's relative paths resolve inside the package."""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from diffquant.checkpoint import training_context
from diffquant.pairs import resolve_pair

from .helpers import load_script

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup_module_():
    return load_script(REPO / "setup.py")


def mirror(files: list[Path], root: Path, dest: Path) -> None:
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, dest / rel)


def test_the_packaged_files_keep_the_registered_pair_resolvable(setup_module_, tmp_path, monkeypatch):
    files = setup_module_.packaged_files()
    assert Path("calib/models/pairs.json") in files and Path("calib/models/stories260K.gguf") in files
    registry = json.loads((REPO / "calib/models/pairs.json").read_text())
    packaged = [name for name, entry in registry["pairs"].items() if entry.get("packaged")]
    assert packaged == [registry["default"]]  # the demo's default pair runs from a wheel
    mirror(files, REPO, tmp_path)
    monkeypatch.setenv("DIFFQUANT_CALIB", str(tmp_path / "calib"))
    pair = resolve_pair()  # sha256-checked against the copies
    in_repo = {arch: REPO / registry["pairs"][pair.name][arch]["path"].removeprefix("../../") for arch in pair.paths}
    for arch, folder in pair.paths.items():
        assert folder.is_relative_to(tmp_path)
        assert training_context(folder) == training_context(in_repo[arch]) == 512  # the run's train_log came too
        assert (folder.parent / "train_log.json").read_bytes() == (in_repo[arch].parent / "train_log.json").read_bytes()


def test_a_packaged_pair_outside_the_repository_is_refused(setup_module_, tmp_path, monkeypatch):
    (tmp_path / "calib" / "models").mkdir(parents=True)
    entry = {"path": "/elsewhere/final", "sha256": "0" * 64}
    (tmp_path / "calib" / "models" / "pairs.json").write_text(json.dumps(
        {"pairs": {"far": {"packaged": True, "transformer": entry, "diff": entry}}}))
    monkeypatch.setattr(setup_module_, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match="packaged pair 'far' needs its checkpoint inside the repository"):
        setup_module_.packaged_files()


@pytest.mark.slow
def test_an_installed_wheel_lists_the_shipped_pair_ready_from_any_folder(setup_module_, tmp_path):
    """Build the wheel from a source tree of what it needs, install it (no dependencies: this interpreter's
    site-packages provide them) into a fresh venv and run `diffquant demo --list` outside the repository."""
    src = tmp_path / "src"
    mirror([Path("pyproject.toml"), Path("setup.py"), Path("README.md"), *setup_module_.packaged_files()], REPO, src)
    shutil.copytree(REPO / "diffquant", src / "diffquant", ignore=shutil.ignore_patterns("__pycache__", "_data"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DIFFQUANT_CALIB")}  # only the wheel's
    run = dict(check=True, capture_output=True, text=True, env=env)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "whl"), str(src)], **run)
    (wheel,) = (tmp_path / "whl").glob("diffquant-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], **run)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          **run).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], **run)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([str(venv / "bin" / "diffquant"), "demo", "--list"], cwd=elsewhere, **run).stdout
    default = out.split("\n\n")[1]
    assert default.startswith("xs (default)") and "ready (sha256 checked)" in default
    assert str(Path(site) / "diffquant" / "_data" / "experiments") in default
