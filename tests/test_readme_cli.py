"""Every `diffquant …` line (and the lm-eval line) of the README's "Using it on your own checkpoint" section runs on
the shipped models as written, on fewer tokens: the size flags are turned down, nothing else is changed."""

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SECTION = ("## Using it on your own checkpoint", "### Training into the outlier regime")
SMALLER = {"--tokens": "2048", "--limit": "2", "--calib-tokens": "512"}  # flag -> the value the test uses
EXTRA = {"demo": ["--profile-windows", "2", "--ppl-windows", "2", "--limit", "2", "--calib-tokens", "512",
                  "--no-stories", "--out", "demo-out"],
         "train": ["--eval-tokens", "4096", "--tokens", "8192"],
         "quantize": ["--calib-tokens", "512"]}


def readme_lines() -> tuple[dict[str, str], list[str]]:
    """(shell variables, commands) of the section's bash blocks: continuations joined, comments dropped."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION[0]):text.index(SECTION[1])]
    variables, commands = {}, []
    for block in re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if m := re.fullmatch(r"([A-Z]+)=(\S+)", line):
                variables[m[1]] = m[2]
            elif line.startswith(("diffquant ", "python -m diffquant.lmeval ")):
                commands.append(line)
    return variables, commands


def argv_of(line: str, variables: dict[str, str]) -> list[str]:
    for name, value in variables.items():
        line = line.replace(f"${name}", value)
    words = shlex.split(line)
    words = words[1:] if words[0] == "diffquant" else words[3:]
    out, i = [], 0
    while i < len(words):
        if words[i] in SMALLER:
            out += [words[i], SMALLER[words[i]]]
            i += 2
            while i < len(words) and not words[i].startswith("-"):
                i += 1
            continue
        out.append(words[i])
        i += 1
    return out + EXTRA.get(out[0] if words[0] != "-m" else "", [])


def test_the_section_has_commands():
    variables, commands = readme_lines()
    assert {"T", "D"} <= set(variables) and len(commands) >= 10
    assert {c.split()[1] for c in commands if c.startswith("diffquant")} >= {
        "info", "profile", "quantize", "sweep", "report", "convert", "demo", "train"}


@pytest.mark.slow
def test_every_readme_command_runs(tmp_path, monkeypatch, capsys):
    from diffquant.cli import main

    for name in ("experiments", "calib"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)  # outputs land here, never in the repository
    variables, commands = readme_lines()
    for line in commands:
        argv = argv_of(line, variables)
        if line.startswith("python -m diffquant.lmeval"):
            pytest.importorskip("lm_eval")
            from diffquant.lmeval import main as lmeval_main

            code = lmeval_main(argv)
        else:
            code = main(argv)
        assert code == 0, f"{line}\n -> {argv}\n{capsys.readouterr().err[-2000:]}"
    assert (tmp_path / "records.jsonl").is_file() and (tmp_path / "demo-out" / "summary.json").is_file()
