"""experiments/README.md indexes every script under experiments/ and every file of experiments/results/."""

from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
INDEX = (EXPERIMENTS / "README.md").read_text()
SKIP = {"results", "campaign/long", "campaign/short", "campaign/realtext", "campaign/ablation", "lr_sweep/runs",
        "corpus", "checkpoints"}  # run outputs, indexed by the script that writes them


def scripts() -> list[str]:
    found = []
    for path in sorted(EXPERIMENTS.rglob("*")):
        rel = path.relative_to(EXPERIMENTS).as_posix()
        if path.suffix in {".py", ".sh"} and not any(rel.startswith(s + "/") for s in SKIP) and ".venv" not in rel:
            found.append(rel)
    return found


def test_every_script_is_indexed():
    assert scripts(), "no scripts found: the test looks in the wrong place"
    missing = [s for s in scripts() if f"`{s}`" not in INDEX and f"`{s.split('/')[-1]}`" not in INDEX]
    assert not missing, f"experiments/README.md does not list: {missing}"


def test_every_results_file_has_a_command():
    entries = sorted(p.name for p in (EXPERIMENTS / "results").iterdir())
    missing = [name for name in entries if name not in INDEX]
    assert not missing, f"experiments/README.md gives no command for results/{missing}"
