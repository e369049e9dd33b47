"""experiments/thin_logs.py: tqdm redraws thinned to one per interval; every other line, and each bar's first and
last redraw, kept; a second pass changes nothing."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("thin_logs", ROOT / "experiments" / "thin_logs.py")
thin_logs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(thin_logs)


def bar(desc: str, step: int, elapsed: int) -> str:
    return f"{desc}:  {step}%|##   | {step}/100 [{elapsed // 60:02d}:{elapsed % 60:02d}<01:00, 1.00s/it]"


def test_redraws_are_thinned_and_everything_else_kept():
    train = [bar("train diff", i, 7 * i) for i in range(20)]  # one redraw every 7 s of elapsed time
    profile = [bar("profile", i, 3 * i) for i in range(5)]
    text = ("\r" + "\r".join(train) + "\n{\n  \"steps\": 20\n}\n"
            + "\r" + "\r".join(profile) + "\r" + bar("train transformer", 0, 0) + "\ndone\n")
    thinned = thin_logs.thin(text, every=30)
    lines = thinned.split("\n")
    kept_train = [line for line in lines if line.startswith("train diff")]
    # first, then every redraw >= 30 s after the last kept (0, 35, 70, 105), then the last one (133 s)
    assert kept_train == [train[0], train[5], train[10], train[15], train[19]]
    assert lines[5:8] == ["{", '  "steps": 20', "}"]
    assert [line for line in lines if line.startswith("profile")] == [profile[0], profile[-1]]
    assert lines[-3:] == [bar("train transformer", 0, 0), "done", ""]
    assert "\r" not in thinned
    assert thin_logs.thin(thinned, every=30) == thinned


def test_hour_long_clocks_are_read():
    assert thin_logs.seconds("1:02:03") == 3723 and thin_logs.seconds("02:03") == 123
    assert thin_logs.BAR.match(bar("train", 5, 4000))["elapsed"] == "66:40"
