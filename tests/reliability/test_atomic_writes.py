"""Fault injection for writes: whatever fails or is killed mid-way, the previous output stays whole and visible,
and the next writer cleans up after a dead one. Plus the one-writer lock on sweep records."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import diffquant.io as dio
from diffquant import build_model, load_checkpoint, save_checkpoint

from .conftest import fingerprint, run_cli, tiny_config


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


@pytest.fixture
def old(tmp_path) -> Path:
    """A checkpoint folder that a later write tries to replace."""
    return save_checkpoint(build_model(tiny_config(), seed=0), tmp_path / "ckpt")


def _replace(target: Path) -> None:
    save_checkpoint(build_model(tiny_config(), seed=1), target, overwrite=True)


def _siblings(target: Path) -> list[str]:
    return sorted(p.name for p in target.parent.iterdir())


def test_failed_exchange_keeps_the_old_version(old, monkeypatch):
    before = fingerprint(old)

    def fails(a, b):
        raise OSError("disk on fire")

    monkeypatch.setattr(dio, "exchange", fails)
    with pytest.raises(OSError, match="disk on fire"):
        _replace(old)
    assert fingerprint(old) == before and _siblings(old) == ["ckpt"]


def test_failed_second_rename_restores_the_old_version(old, monkeypatch):
    """Where exchange is unsupported: two renames; the second failing puts the old folder back."""
    before = fingerprint(old)
    monkeypatch.setattr(dio, "exchange", lambda a, b: False)
    real, calls = os.rename, []

    def second_fails(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise OSError("killed between the renames")
        real(a, b)

    monkeypatch.setattr(dio.os, "rename", second_fails)
    with pytest.raises(OSError, match="between the renames"):
        _replace(old)
    monkeypatch.setattr(dio.os, "rename", real)
    assert fingerprint(old) == before and _siblings(old) == ["ckpt"]


def test_kill_between_two_renames_is_repaired_by_the_next_writer(old):
    """A writer killed after moving the old folder aside: the next writer renames it back first."""
    aside = dio.scratch_name(old, dio.OLD_TAG, pid=_dead_pid())
    before = fingerprint(old)
    os.rename(old, aside)  # what the killed writer left: no ckpt, the old version hidden beside it
    dio.clean_stale(old)
    assert _siblings(old) == ["ckpt"] and fingerprint(old) == before
    assert load_checkpoint(old).config == tiny_config()


def test_old_version_left_by_earlier_releases_is_restored(old):
    """diffquant before this fix left ``.NAME.old-PID`` as the only copy when killed between its renames."""
    before = fingerprint(old)
    os.rename(old, old.with_name(f".ckpt.old-{_dead_pid()}"))
    dio.clean_stale(old)  # what the next writer of ckpt does first
    assert _siblings(old) == ["ckpt"] and fingerprint(old) == before


def test_stale_temporaries_of_dead_writers_are_removed_live_and_foreign_ones_kept(old):
    dead = dio.scratch_name(old, dio.TMP_TAG, pid=_dead_pid())
    live = dio.scratch_name(old, dio.TMP_TAG)
    stale_file = dio.scratch_name(old, dio.TMP_TAG, ".json", pid=_dead_pid())
    other_host = old.with_name(f".ckpt.{dio.TMP_TAG}-elsewhere-{_dead_pid()}-0123abcd")  # not ours to judge
    for p in (dead, live, other_host):
        p.mkdir()
        (p / "model.safetensors").write_bytes(b"half")
    stale_file.write_text("{")
    unrelated = old.with_name(".ckpt.mine")
    unrelated.mkdir()
    _replace(old)
    assert _siblings(old) == sorted([".ckpt.mine", live.name, other_host.name, "ckpt"])


def test_killed_writer_leaves_the_old_version_visible(old):
    """A real SIGKILL of a process replacing the folder, at the moment it would swap: the old one is intact."""
    before = fingerprint(old)
    script = textwrap.dedent(f"""
        import os, signal
        import diffquant.io as dio
        from diffquant import build_model, save_checkpoint
        from tests.reliability.conftest import tiny_config
        dio.exchange = lambda a, b: os.kill(os.getpid(), signal.SIGKILL)
        save_checkpoint(build_model(tiny_config(), seed=1), {str(old)!r}, overwrite=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == -signal.SIGKILL
    assert fingerprint(old) == before  # still the old version, whole
    assert any(dio.TMP_TAG in name for name in _siblings(old))  # the killed writer's temporary folder ...
    _replace(old)
    assert _siblings(old) == ["ckpt"]  # ... is removed by the next writer


def test_failed_file_replace_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "table.md"
    target.write_text("old table\n")

    def fails(a, b):
        raise OSError("no space left")

    monkeypatch.setattr(dio.os, "replace", fails)
    with pytest.raises(OSError):
        dio.atomic_write_text(target, "new table\n")
    assert target.read_text() == "old table\n" and _siblings(target) == ["table.md"]


def test_second_sweep_on_the_same_records_exits_2(assets, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    with dio.locked_append(out):
        code, _, err = run_cli(["sweep", assets["ckpt"], "--target", "attn_logits", "--bits", "16", "--tasks",
                                assets["text"], "--limit", "1", "--out", out], capsys)
    assert code == 2 and err.count("\n") == 1 and "another process is writing" in err
    assert out.read_text() == ""


def test_resume_skips_cells_already_there_even_duplicated(assets, tmp_path, capsys):
    """A file where two unlocked sweeps wrote every cell twice: a resumed sweep computes nothing again."""
    out = tmp_path / "r.jsonl"
    argv = ["sweep", assets["ckpt"], "--target", "attn_logits", "--bits", "16", "8", "--tasks", assets["text"],
            "--limit", "1", "--out", out, "--no-table"]
    assert run_cli(argv, capsys)[0] == 0
    out.write_text(out.read_text() * 2)
    code, printed, _ = run_cli(argv, capsys)
    assert code == 0 and '"written": 0' in printed and len(out.read_text().splitlines()) == 4
