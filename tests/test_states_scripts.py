"""park_states.sh / restore_states.sh: a run's states leave main's tree, and come back byte for byte into a
`git clone --depth 1` of it (a throwaway repository, with the real scripts)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

CAMPAIGN = Path(__file__).resolve().parents[1] / "experiments" / "campaign"
RUN = "experiments/campaign/long/xs-test"
STATE_FILES = ("diff/state/optimizer.safetensors", "diff/state/model/model.safetensors",
               "diff/branches/step000004/model.safetensors", "transformer/snapshots/step000002/model.safetensors")

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def script(repo: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", f"experiments/campaign/{name}", *args], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"})


@pytest.fixture
def origin(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A repository like main: the scripts, an empty states.json, a run whose states git ignores."""
    repo = tmp_path / "origin"
    (repo / "experiments" / "campaign").mkdir(parents=True)
    for name in ("park_states.sh", "restore_states.sh"):
        shutil.copy(CAMPAIGN / name, repo / "experiments" / "campaign" / name)
    (repo / "experiments" / "campaign" / "states.json").write_text(json.dumps({"about": "t", "runs": {}}))
    shutil.copy(CAMPAIGN.parents[1] / ".gitignore", repo / ".gitignore")
    contents = {}
    for i, rel in enumerate(STATE_FILES):
        path = repo / RUN / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        contents[rel] = os.urandom(1000 + i)  # fresh bytes: a restore that mixed files up would show
        path.write_bytes(contents[rel])
    (repo / RUN / "diff" / "train_log.json").write_text("{}")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init")
    assert not any(rel in git(repo, "ls-files") for rel in STATE_FILES)  # ignored from the start
    return repo, contents


def parked(repo: Path) -> list[dict]:
    return json.loads((repo / "experiments/campaign/states.json").read_text())["runs"][RUN]


def test_park_then_restore_into_a_shallow_clone(origin, tmp_path):
    repo, contents = origin
    done = script(repo, "park_states.sh", RUN)
    assert done.returncode == 0, done.stderr
    tree = git(repo, "ls-files")
    assert "train_log.json" in tree and not any(rel in tree for rel in STATE_FILES)  # out of main's tree again
    [entry] = parked(repo)
    assert entry["paths"] == ["diff/branches", "diff/state", "transformer/snapshots"]
    held = git(repo, "ls-tree", "-r", "--name-only", entry["commit"])
    assert all(f"{RUN}/{rel}" in held for rel in STATE_FILES)  # the parked commit holds every file
    assert all((repo / RUN / rel).read_bytes() == data for rel, data in contents.items())  # disk untouched

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", "--single-branch", f"file://{repo}", str(clone)],
                   check=True)
    assert not (clone / RUN / "diff" / "state").exists()
    done = script(clone, "restore_states.sh", RUN)
    assert done.returncode == 0, done.stderr
    assert all((clone / RUN / rel).read_bytes() == data for rel, data in contents.items())
    assert git(clone, "status", "--porcelain") == ""  # restored files stay ignored

    again = script(clone, "restore_states.sh", RUN)  # never overwrites
    assert again.returncode == 2 and "exists" in again.stderr and len(again.stderr.splitlines()) == 1


def test_refusals_are_one_line(origin):
    repo, _ = origin
    for name, args, words in (("restore_states.sh", ("experiments/campaign/long/nope",), "not in"),
                              ("restore_states.sh", (), "name a run"),
                              ("park_states.sh", ("experiments/campaign/long/nope",), "not a folder"),
                              ("park_states.sh", (f"{RUN}/diff/state/model",), "has no state/")):
        done = script(repo, name, *args)
        assert done.returncode == 2 and words in done.stderr and len(done.stderr.splitlines()) == 1


def test_park_only_the_named_paths(origin):
    repo, _ = origin
    done = script(repo, "park_states.sh", RUN, "diff/state")
    assert done.returncode == 0, done.stderr
    [entry] = parked(repo)
    held = git(repo, "ls-tree", "-r", "--name-only", entry["commit"])
    assert entry["paths"] == ["diff/state"] and f"{RUN}/diff/state/optimizer.safetensors" in held
    assert f"{RUN}/diff/branches/step000004/model.safetensors" not in held
    missing = script(repo, "park_states.sh", RUN, "diff/nope")
    assert missing.returncode == 2 and "diff/nope does not exist" in missing.stderr
    one_file = "diff/branches/step000004/model.safetensors"  # files park too (a corpus's shards)
    done = script(repo, "park_states.sh", RUN, one_file)
    assert done.returncode == 0, done.stderr
    assert parked(repo)[-1]["paths"] == [one_file] and f"{RUN}/{one_file}" not in git(repo, "ls-files")
    assert f"{RUN}/{one_file}" in git(repo, "ls-tree", "-r", "--name-only", parked(repo)[-1]["commit"])


def test_parts_tracked_in_the_tree_and_parked_again(origin, tmp_path):
    """States main's tree still tracks are parked without a new commit (HEAD holds them); a run gathers one part per
    commit, a path parked again replaces its older part, and a restore writes every part back."""
    repo, contents = origin
    git(repo, "add", "-f", f"{RUN}/diff/branches")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "tracked like the old campaign runs")
    tracked_at = git(repo, "rev-parse", "HEAD").strip()
    assert script(repo, "park_states.sh", RUN, "diff/branches").returncode == 0
    assert parked(repo) == [{"commit": tracked_at, "paths": ["diff/branches"], "note": "parked by park_states.sh"}]
    assert "diff/branches" not in git(repo, "ls-files")

    assert script(repo, "park_states.sh", RUN, "diff/state").returncode == 0  # a second part, a new commit
    (repo / RUN / "diff/state/optimizer.safetensors").write_bytes(b"later step")  # the run went on
    contents["diff/state/optimizer.safetensors"] = b"later step"
    done = script(repo, "park_states.sh", RUN, "diff/state")
    assert done.returncode == 0, done.stderr
    parts = parked(repo)
    assert [p["paths"] for p in parts] == [["diff/branches"], ["diff/state"]] and parts[0]["commit"] == tracked_at

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", "--single-branch", f"file://{repo}", str(clone)],
                   check=True)
    done = script(clone, "restore_states.sh", RUN)
    assert done.returncode == 0, done.stderr
    for rel, data in contents.items():
        if rel.startswith("diff/"):
            assert (clone / RUN / rel).read_bytes() == data
    listing = script(clone, "restore_states.sh", "--list").stdout.splitlines()
    assert len(listing) == 2 and all(line.startswith(RUN) for line in listing)


def test_a_finals_weights_are_parked_under_its_folder_and_finals_restores_every_one(origin, tmp_path):
    repo, _ = origin
    final = f"{RUN}/cooldown/diff-step000004/final"
    (repo / final).mkdir(parents=True)
    weights = os.urandom(2048)
    (repo / final / "model.safetensors").write_bytes(weights)
    (repo / final / "config.json").write_text("{}")
    git(repo, "add", f"{final}/config.json")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a final")
    assert f"{final}/model.safetensors" not in git(repo, "ls-files")  # .gitignore: a final's weights are parked
    done = script(repo, "park_states.sh", final, "model.safetensors")
    assert done.returncode == 0, done.stderr
    assert f"{final}/config.json" in git(repo, "ls-files") and f"{final}/model.safetensors" not in git(repo, "ls-files")

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", "--single-branch", f"file://{repo}", str(clone)],
                   check=True)
    done = script(clone, "restore_states.sh", "--finals")
    assert done.returncode == 0, done.stderr
    assert (clone / final / "model.safetensors").read_bytes() == weights
    assert not (clone / RUN / "diff" / "state").exists()  # only finals: the run's states stay parked
    again = script(clone, "restore_states.sh", "--finals")
    assert again.returncode == 0 and again.stdout.strip() == "every parked final is here"
