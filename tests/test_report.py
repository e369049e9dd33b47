"""Reports from the fixture records file: every number equals a direct recomputation from the records.

``tests/fixtures/records.jsonl`` comes from a real sweep of two tiny random-weight checkpoints (a Transformer
and its matched Diff model, vocab 8192, max_seq_len 32): attention logits at 16 / 8 / 4 bits and RTN weights at
4 bits (group 16), on tinystories (perplexity, 16 windows), copa and lambada (16 items each). Regenerate it
from the repository root with ``python -m tests.test_report`` (a few seconds; the records' checkpoint paths are
the relative names ``tiny-transformer`` / ``tiny-diff``).
"""
import ast
import csv
import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from diffquant.cli import main
from diffquant.paired import difference_of_degradations, mcnemar_exact, paired_bootstrap, paired_bootstrap_ppl
from diffquant.plots import plot_degradation
from diffquant.records import load_records, read_records
from diffquant.report import comparison_rows, degradation_rows, format_cell, render_report

FIXTURE = Path(__file__).parent / "fixtures" / "records.jsonl"
CORRECT = {"acc": "correct", "acc_norm": "correct_norm"}


@pytest.fixture(scope="module")
def records():
    return load_records([FIXTURE])


def _baseline(records, rec):
    same = ("checkpoint", "task", "limit", "seed", "attn_impl")
    return next(r for r in records if r["bits"] == 16 and all(r[k] == rec[k] for k in same))


def _by_id(rec, key):
    return {item["id"]: item[key] for item in rec["metrics"]["items"]}


def _expected(records, rec, metric):
    """The delta of ``rec`` from its baseline, recomputed with the statistics functions directly."""
    base = _baseline(records, rec)
    if metric in CORRECT:
        a, b = _by_id(base, CORRECT[metric]), _by_id(rec, CORRECT[metric])
        ids = sorted(a)
        assert ids == sorted(b)
        x, y = np.array([a[i] for i in ids], float), np.array([b[i] for i in ids], float)
        out = paired_bootstrap(x, y)
        return out["delta"], out["low"], out["high"], mcnemar_exact(x, y)
    if rec["kind"] == "lambada":
        a, b = _by_id(base, "ll"), _by_id(rec, "ll")
        wa, wb = [[-a[i], 1] for i in sorted(a)], [[-b[i], 1] for i in sorted(b)]
    else:
        wa, wb = base["metrics"]["window_losses"], rec["metrics"]["window_losses"]
    out = paired_bootstrap_ppl(wa, wb)
    return out["delta"], out["low"], out["high"], None


def _metrics_of(rec):
    return {"perplexity": ["perplexity"], "multiple_choice": ["acc", "acc_norm"],
            "lambada": ["acc", "perplexity"]}[rec["kind"]]


def test_fixture_holds_a_real_sweep(records):
    assert len(records) == 24
    assert {r["kind"] for r in records} == {"perplexity", "multiple_choice", "lambada"}
    assert {r["arch"] for r in records} == {"transformer", "diff"}
    assert {(r["target"], r["bits"]) for r in records} == {(None, 16), ("attn_logits", 8), ("attn_logits", 4),
                                                          ("weights-rtn", 4)}


def test_cells_equal_statistics_recomputed_from_the_records(records):
    cells = degradation_rows(records)
    quantized = [r for r in records if r["bits"] != 16]
    assert len([c for c in cells if c.bits != 16]) == sum(len(_metrics_of(r)) for r in quantized)
    for rec in quantized:
        for metric in _metrics_of(rec):
            (cell,) = [c for c in cells if c.checkpoint == rec["checkpoint"] and c.bits == rec["bits"]
                       and c.metric == metric and c.task.startswith(rec["task"])
                       and c.scheme.startswith(rec["target"])]
            assert cell.value == rec["metrics"][metric]
            assert (cell.delta, cell.low, cell.high, cell.p) == _expected(records, rec, metric)
            base = _baseline(records, rec)["metrics"][metric]
            assert cell.value - base == pytest.approx(cell.delta, rel=1e-9, abs=1e-12)


def _markdown_tables(text):
    """{scheme heading: [row dicts]} of the markdown output."""
    tables, heading, header = {}, None, None
    for line in text.splitlines():
        if line.startswith("### "):
            heading, header = line[4:], None
            tables[heading] = []
        elif line.startswith("|") and not set(line) <= set("|-: "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            else:
                tables[heading].append(dict(zip(header, cells, strict=True)))
    return tables


def test_markdown_cells_are_the_recomputed_numbers(records):
    tables = _markdown_tables(render_report(records, "markdown"))
    schemes = [h for h in tables if "Diff vs Transformer" not in h]
    assert [h.split(":")[0] for h in schemes] == ["attn_logits/sequence", "weights-rtn/g16"]
    for cell in degradation_rows(records):
        (table,) = [rows for h, rows in tables.items() if h.startswith(cell.scheme + ": value")]
        metric = f"{cell.metric} (%)" if cell.metric in CORRECT else cell.metric
        (row,) = [r for r in table if (r["model"], r["task"], r["metric"]) == (cell.model, cell.task, metric)]
        assert row[f"{cell.bits} bit"] == format_cell(cell)
    one = next(c for c in degradation_rows(records) if c.metric == "acc" and c.bits == 4)
    assert format_cell(one) == (f"{100 * one.value:.2f} ({100 * one.delta:+.2f} [{100 * one.low:+.2f}, "
                                f"{100 * one.high:+.2f}], p={one.p:.2g})")
    columns = {h.split(":")[0]: list(rows[0])[3:] for h, rows in tables.items() if h in schemes}
    assert columns == {"attn_logits/sequence": ["16 bit", "8 bit", "4 bit"], "weights-rtn/g16": ["16 bit", "4 bit"]}


def test_csv_has_full_precision_numbers(records):
    rows = list(csv.DictReader(io.StringIO(render_report(records, "csv"))))
    deg = [r for r in rows if r["section"] == "degradation"]
    assert len(deg) == len(degradation_rows(records))
    for rec in (r for r in records if r["bits"] != 16):
        for metric in _metrics_of(rec):
            (row,) = [r for r in deg if r["model"] == rec["label"] and r["bits"] == str(rec["bits"])
                      and r["metric"] == metric and r["task"].startswith(rec["task"])
                      and r["scheme"].startswith(rec["target"])]
            delta, low, high, p = _expected(records, rec, metric)
            assert float(row["value"]) == rec["metrics"][metric]
            assert (float(row["delta"]), float(row["low"]), float(row["high"])) == (delta, low, high)
            assert (row["p_mcnemar"] == "") if p is None else float(row["p_mcnemar"]) == p
    assert all(r["delta"] == "" for r in deg if r["bits"] == "16")


def test_latex_renders_escaped_tables(records):
    text = render_report(records, "latex")
    assert text.count(r"\begin{tabular}") == 4 and text.startswith("% attn_logits/sequence")
    assert r"acc\_norm (\%)" in text and r"$\Delta$" in text and "Δ" not in text
    cell = next(c for c in degradation_rows(records) if c.bits == 8 and c.metric == "perplexity")
    assert format_cell(cell) in text


def test_comparison_equals_difference_of_degradations(records):
    comps = comparison_rows(records)
    assert {(c.scheme, c.bits) for c in comps} == {("attn_logits/sequence", 8), ("attn_logits/sequence", 4),
                                                    ("weights-rtn/g16", 4)}
    pick = {r["arch"]: r for r in records if r["target"] == "attn_logits" and r["bits"] == 4 and r["task"] == "copa"}
    t, d = pick["transformer"], pick["diff"]
    arrays = []
    for rec in (_baseline(records, t), t, _baseline(records, d), d):
        c = _by_id(rec, "correct")
        arrays.append(np.array([c[i] for i in sorted(c)], float))
    expected = difference_of_degradations(*arrays)
    (row,) = [c for c in comps if c.bits == 4 and c.scheme == "attn_logits/sequence" and c.metric == "acc"
              and c.task.startswith("copa")]
    assert (row.delta_transformer, row.delta_candidate, row.advantage, row.low, row.high) == (
        expected["delta_a"], expected["delta_b"], expected["difference"], expected["low"], expected["high"])


def test_perplexity_comparison_is_the_log_ratio_of_perplexities(records):
    for row in (c for c in comparison_rows(records) if c.metric == "perplexity" and c.task.startswith("tinystories")):
        recs = {r["arch"]: r for r in records if r["bits"] == row.bits and r["task"] == "tinystories"
                and row.scheme.startswith(r["target"])}
        dt, dd = (math.log(recs[a]["metrics"]["perplexity"] / _baseline(records, recs[a])["metrics"]["perplexity"])
                  for a in ("transformer", "diff"))
        assert row.delta_transformer == pytest.approx(dt, abs=1e-12)
        assert row.delta_candidate == pytest.approx(dd, abs=1e-12)
        assert row.advantage == pytest.approx(dt - dd, abs=1e-12) and row.low <= row.advantage <= row.high


def test_no_comparison_across_tokenisations(records):
    """Text windows of different tokenizers do not pair; the same items of a zero-shot task still do."""
    changed = [dict(r, tokenizer_sha256="other") if r["arch"] == "diff" else r for r in records]
    kept = {(c.task.split(" ")[0], c.metric) for c in comparison_rows(changed)}
    assert ("tinystories", "perplexity") not in kept and ("copa", "acc") in kept and ("lambada", "perplexity") in kept


def test_checkpoints_sharing_a_label_stay_apart(records):
    renamed = [dict(r, label="same") for r in records]
    models = {c.model for c in degradation_rows(renamed, metrics=["acc"])}
    assert models == {"tiny-transformer", "tiny-diff"}  # the checkpoint paths


def test_metric_filter_and_baseline_only_records(records, tmp_path):
    only_acc = render_report(records, "csv", metrics=["acc"])
    assert {r["metric"] for r in csv.DictReader(io.StringIO(only_acc))} == {"acc"}
    base = [r for r in records if r["bits"] == 16]
    text = render_report(base, "markdown")
    assert text.startswith("### 16-bit") and "Diff vs" not in text
    with pytest.raises(ValueError, match="unknown metric bleu"):
        render_report(records, "markdown", metrics=["bleu"])


def test_plot_is_written(records, tmp_path):
    path = plot_degradation(records, tmp_path / "fig8.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*"))  # the atomic write left no temporary file


def test_plot_styles_models_shows_16_bit_intervals_and_a_caption(records, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    twin = _copies(records, "transformer", "other-transformer")  # a second Transformer: its own colour and marker
    plot_degradation(records + twin, tmp_path / "fig8.png", n_boot=300)
    (fig,) = figures
    styles = {}
    for ax in (a for a in fig.axes if a.get_visible()):
        for bars in ax.containers:
            line, _, (ranges,) = bars.lines
            label = bars.get_label()
            style = (line.get_color(), line.get_marker(), line.get_linestyle())
            assert styles.setdefault(label, style) == style  # the same model looks the same in every panel
            x16, (y0, y1) = ranges.get_segments()[0][0][0], [p[1] for p in ranges.get_segments()[0]]
            assert abs(x16) < 0.1 and (y1 > y0 or "tinystories" not in ax.get_title())  # the 16-bit point's interval
    assert set(styles) == {"tiny-transformer (Transformer)", "other-transformer (Transformer)", "tiny-diff (Diff)"}
    assert len({s[:2] for s in styles.values()}) == 3  # colour and marker per model, not per arch
    caption = fig.texts[-1].get_text()
    assert "Error bars: 95% bootstrap intervals (300 resamples)" in caption
    assert "tinystories (random 16): 16 windows, 512 tokens" in caption and "copa (random 16): 16 items" in caption


def test_value_interval_of_a_16_bit_record(records):
    from diffquant.paired import bootstrap_ppl_ci
    from diffquant.report import value_interval

    base = {r["task"]: r for r in records if r["bits"] == 16 and r["arch"] == "diff"}
    ppl = bootstrap_ppl_ci(base["tinystories"]["metrics"]["window_losses"], n=500, seed=1)
    assert value_interval(base["tinystories"], "perplexity", 500, 1) == (ppl["low"], ppl["high"])
    low, high = value_interval(base["copa"], "acc", 500, 1)
    assert low <= base["copa"]["metrics"]["acc"] <= high and low < high
    every = {**base["copa"], "metrics": {**base["copa"]["metrics"],
                                         "items": [{**it, "correct": True} for it in base["copa"]["metrics"]["items"]]}}
    assert value_interval(every, "acc", 500, 1) == (1.0, 1.0)


def test_cli_renders_every_format_and_the_plot(tmp_path, capsys):
    for fmt in ("markdown", "csv", "latex"):
        assert main(["report", str(FIXTURE), "--format", fmt, "--n-boot", "500"]) == 0
        assert capsys.readouterr().out.strip()
    assert main(["report", str(FIXTURE), "--metric", "acc_norm", "--plot", str(tmp_path / "p.png"),
                 "--output", str(tmp_path / "t.md"), "--n-boot", "500"]) == 0
    assert (tmp_path / "p.png").is_file() and (tmp_path / "t.md").read_text().strip() == capsys.readouterr().out.strip()


def test_truncated_last_line_and_duplicates(records, tmp_path):
    path = tmp_path / "r.jsonl"
    shutil.copy(FIXTURE, path)
    with path.open("a") as fh:
        fh.write(FIXTURE.read_text().splitlines()[0] + "\n")  # the same record again: the later one wins
        fh.write('{"checkpoint": "tiny-d')  # an interrupted write
    assert len(read_records(path)) == 25
    assert load_records([path]) == records


@pytest.mark.parametrize("content, message", [
    ("", "no records in"),
    ("\n\n", "no records in"),
    ('{"a": 1}\n{"b": 2}\n', "r.jsonl:1: not a sweep record"),
    ("not json\n{}\n", "r.jsonl:1: not a JSON record"),
])
def test_bad_records_files_are_one_line_errors(tmp_path, capsys, content, message):
    path = tmp_path / "r.jsonl"
    path.write_text(content)
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("diffquant: error:") and err.count("\n") == 1 and message in err


@pytest.mark.parametrize("argv, message", [
    (["--format", "html"], "unknown format 'html'"),
    (["--metric", "bleu"], "unknown metric bleu"),
    (["--n-boot", "0"], "--n-boot: must be an integer in 1..100000"),
])
def test_bad_options_are_one_line_errors(capsys, argv, message):
    assert main(["report", str(FIXTURE), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_missing_file_as_a_user_sees_it(tmp_path):
    run = subprocess.run([sys.executable, "-m", "diffquant.cli", "report", str(tmp_path / "nope.jsonl")],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "records file not found" in run.stderr


def test_report_imports_no_model_code():
    """Reports read records only: no model, quantization, checkpoint or sweep module is imported."""
    source = (Path(__file__).parents[1] / "diffquant" / "report.py").read_text()
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    forbidden = {"model", "quant", "checkpoint", "sweep", "torch", "profile"}
    assert not {m for m in imported if m.split(".")[-1] in forbidden or m.split(".")[0] in forbidden}


# ------------------------------------------------------------------------------------------------ the fixture

def make_fixture(out: Path = FIXTURE) -> None:
    """Build two tiny random-weight checkpoints and sweep them into ``out`` (see the module docstring)."""
    import os
    import tempfile

    import torch

    import diffquant as dq

    from .conftest import tiny_config
    from .helpers import randomize_

    out = out.resolve()
    out.unlink(missing_ok=True)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            torch.manual_seed(0)
            for arch in ("transformer", "diff"):
                model = randomize_(dq.build_model(tiny_config(arch, vocab_size=8192, max_seq_len=32)))
                dq.save_checkpoint(model, f"tiny-{arch}")
            common = ["tiny-transformer", "tiny-diff", "--tasks", "tinystories,copa,lambada", "--limit", "16",
                      "--out", str(out), "--no-table"]
            assert main(["sweep", *common, "--target", "attn_logits", "--bits", "16", "8", "4"]) == 0
            assert main(["sweep", *common, "--target", "weights-rtn", "--bits", "16", "4", "--group-size", "16"]) == 0
        finally:
            os.chdir(cwd)


if __name__ == "__main__":
    make_fixture()


def test_every_other_arm_is_set_against_the_transformer(records):
    """A gated model's records (the Diff records relabelled) compare exactly as the Diff ones do."""
    gated = [dict(r, arch="gated", checkpoint=r["checkpoint"] + "-gated", label=(r.get("label") or "d") + "-g")
             for r in records if r["arch"] == "diff"]
    comps = comparison_rows(records + gated)
    by_arm = {arm: {(c.scheme, c.task, c.metric, c.bits): (c.advantage, c.low, c.high)
                    for c in comps if c.candidate_arch == arm} for arm in ("diff", "gated")}
    assert by_arm["diff"] and by_arm["gated"] == by_arm["diff"]
    assert {c.candidate_arch for c in comparison_rows(records)} == {"diff"}


def _copies(records, arch: str, label: str, **model_changes) -> list[dict]:
    return [dict(r, checkpoint=label, label=label, model={**r["model"], **model_changes})
            for r in records if r["arch"] == arch]


def test_only_declared_pairs_are_compared(records):
    """An unrelated Transformer (other config) is never paired by default; of two matched ones, the run family."""
    stranger = _copies(records, "transformer", "stories260K", d_model=64)
    twin = _copies(records, "transformer", "other-transformer")  # matched config, another run family
    comps = comparison_rows(records + stranger + twin)
    assert {(c.transformer, c.candidate) for c in comps} == {("tiny-transformer", "tiny-diff")}
    assert {(c.transformer, c.candidate) for c in comparison_rows(records + stranger + twin[:0])} == {
        ("tiny-transformer", "tiny-diff")}
    alone = [r for r in records if r["arch"] == "diff"] + twin  # no same-family partner: the matched one
    assert {(c.transformer, c.candidate) for c in comparison_rows(alone)} == {("other-transformer", "tiny-diff")}
    named = comparison_rows(records + stranger, pairs=[("stories260K", "tiny-diff")])
    assert named and {(c.transformer, c.candidate) for c in named} == {("stories260K", "tiny-diff")}
    with pytest.raises(ValueError, match="'tiny-diff' is not a Transformer"):
        comparison_rows(records, pairs=[("tiny-diff", "tiny-transformer")])


def test_cli_pair_flag(tmp_path, capsys):
    recs = load_records([FIXTURE])
    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps(r) + "\n" for r in _copies(recs, "transformer", "stories260K", d_model=64)))
    assert main(["report", str(FIXTURE), str(extra), "--n-boot", "200"]) == 0
    out = capsys.readouterr().out
    assert "tiny-transformer vs tiny-diff" in out and "stories260K vs" not in out
    assert main(["report", str(FIXTURE), str(extra), "--n-boot", "200", "--pair", "stories260K:tiny-diff"]) == 0
    out = capsys.readouterr().out
    assert "stories260K vs tiny-diff" in out and "tiny-transformer vs tiny-diff" not in out
    for bad, message in (("nocolon", "expected TRANSFORMER:OTHER"),
                         ("ghost:tiny-diff", "'ghost' is not a Transformer")):
        assert main(["report", str(FIXTURE), "--pair", bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err


def test_plot_with_fewer_panels_than_grid_cells(records, tmp_path):
    """Panels that do not fill the last row of the 3-wide grid: the spare axes are hidden, nothing raises."""
    from diffquant.plots import plot_degradation
    from diffquant.report import PRIMARY_METRIC, degradation_rows

    def panels(recs):
        return {(c.scheme, c.task) for c in degradation_rows(recs) if c.metric == PRIMARY_METRIC[c.kind]}

    tasks = sorted({r["task"] for r in records})
    subsets = ([r for r in records if r["task"] in tasks[:n]] for n in range(1, len(tasks) + 1))
    keep = next(sub for sub in subsets if len(panels(sub)) > 3 and len(panels(sub)) % 3)  # a 3-wide, ragged grid
    assert plot_degradation(keep, tmp_path / "f.png").stat().st_size > 0
