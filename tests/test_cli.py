import json
import subprocess
import sys

from diffquant import build_model, num_params, save_checkpoint
from diffquant.cli import main

from .conftest import tiny_config


def test_info_prints_config_and_parameter_counts(tmp_path, capsys):
    model = build_model(tiny_config("diff"))
    save_checkpoint(model, tmp_path / "c")
    assert main(["info", str(tmp_path / "c")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["arch"] == "diff"
    assert out["parameters"]["total"] == num_params(model)
    assert out["heads"]["sub_heads_per_head"] == 2


def test_info_on_a_bad_path_exits_2_with_one_line(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffquant: error:") and err.count("\n") == 1


def test_installed_command_exit_codes_as_a_user_sees_them(tmp_path):
    run = subprocess.run([sys.executable, "-m", "diffquant", "info", str(tmp_path / "nope")],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and "does not exist" in run.stderr
    helped = subprocess.run([sys.executable, "-m", "diffquant.cli", "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "info" in helped.stdout
