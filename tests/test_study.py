"""The study (diffquant.study): the gate, where top values sit, and the statistics over seeds (the end-to-end path
through profile and sweep runs in tests/test_gpu_script.py's dry run)."""

import gzip
import json
import math
import random
from pathlib import Path

import pytest
import torch

from diffquant.kinds import SEQUENCE
from diffquant.report import Comparison
from diffquant.study import figure8, gate, outputs, seeds, trend, verdict, zeroshot
from diffquant.study.table5 import top_sites
from diffquant.sweep import missing_cells
from diffquant.tracking import diff_lambdas


def ppl_records(arch: str, base: float, growth: dict[str, float]) -> list[dict]:
    recs = [{"arch": arch, "bits": 16, "granularity": None, "task": "tinystories", "metrics": {"perplexity": base}}]
    recs += [{"arch": arch, "bits": 4, "granularity": g, "task": "tinystories", "metrics": {"perplexity": base * f}}
             for g, f in growth.items()]
    return recs


def site(top1: float, locations=()) -> dict:
    return {"top": [top1, top1 / 2], "locations": list(locations)}


def table5(logit: dict[str, float], hidden: dict[str, float]) -> dict[str, dict]:
    return {a: {"sites": {"attn_logits": site(logit[a]), "hidden": site(hidden[a])}} for a in logit}


PAIR = {"pair": "p", "preset": "xs", "seed": 0, "budget": "b", "tokens": 10,
        "checkpoints": {"transformer": "t", "diff": "d", "gated": "g"}}


@pytest.mark.parametrize("t_top1, t_growth, gate", [(150.0, 2.5, True), (99.0, 9.0, False), (300.0, 1.9, False)])
def test_the_gate_needs_both_a_large_logit_and_a_doubling_perplexity(monkeypatch, t_top1, t_growth, gate):
    monkeypatch.setattr(verdict, "comparison_rows", lambda records: [])
    growth = {g: t_growth for g in figure8.GRANULARITIES}
    records = ppl_records("transformer", 7.0, growth) + ppl_records("diff", 8.0, growth)
    records += ppl_records("gated", 6.0, growth)
    res = verdict.verdict(PAIR, table5({"transformer": t_top1, "diff": 50.0, "gated": 25.0},
                                      {"transformer": 40.0, "diff": 10.0, "gated": 80.0}), records)
    assert res["gate"] is gate
    assert res["ppl_growth_4bit"]["transformer"][SEQUENCE] == pytest.approx(t_growth)
    assert res["versus"]["diff"]["logit_ratio"] == pytest.approx(t_top1 / 50.0)
    assert res["versus"]["gated"]["hidden_ratio"] == pytest.approx(0.5)


def test_verdict_files_each_comparison_under_its_own_arm(monkeypatch):
    def rows(records):
        return [Comparison("attn_logits/sequence", "tinystories", "perplexity", bits, "t", arm, 0.1, 0.05, adv, -1, 1,
                           9, arm) for bits, arm, adv in ((4, "diff", 0.05), (4, "gated", 0.2), (8, "diff", 0.0))]
    monkeypatch.setattr(verdict, "comparison_rows", rows)
    records = [r for a in PAIR["checkpoints"] for r in ppl_records(a, 5.0, {"sequence": 2.0})]
    res = verdict.verdict(PAIR, table5(dict.fromkeys(PAIR["checkpoints"], 120.0),
                                      dict.fromkeys(PAIR["checkpoints"], 9.0)), records)
    assert res["versus"]["diff"]["advantage_4bit"] == {
        "attn_logits/sequence tinystories": {"advantage": 0.05, "low": -1, "high": 1}}
    assert res["versus"]["gated"]["advantage_4bit"]["attn_logits/sequence tinystories"]["advantage"] == 0.2
    assert res["ppl_growth_4bit"]["diff"]["head"] is None  # never measured: no number invented


def test_sign_test_matches_the_binomial_by_hand():
    assert seeds.sign_test([1, 2, 3, 4, 5]) == {"n": 5, "positive": 5, "p": pytest.approx(2 * 0.5 ** 5)}
    tied = seeds.sign_test([0.5, -1.0, 0.0, 2.0])  # ties dropped: 2 of 3
    assert (tied["positive"], tied["p"]) == (2, pytest.approx(1.0))
    assert seeds.sign_test([])["p"] is None


def test_mean_interval_is_the_student_t_interval():
    rng = random.Random(7)
    values = [rng.gauss(0.1, 0.3) for _ in range(6)]
    n, mean = len(values), sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = 2.5705818366147395 * sd / math.sqrt(n)  # t(0.975, 5)
    got = seeds.mean_interval(values)
    assert got["mean"] == pytest.approx(mean, abs=1e-12)
    assert (got["low"], got["high"]) == (pytest.approx(mean - half, abs=1e-9), pytest.approx(mean + half, abs=1e-9))
    assert seeds.mean_interval([0.3])["low"] is None


def test_top_sites_counts_first_token_keys_and_the_second_diff_map():
    locs = [{"layer": 1, "map": 1, "key": 0}, {"layer": 1, "map": 0, "key": 0}, {"layer": 3, "map": 1, "key": 7},
            {"layer": 4, "map": 1, "key": 2}]
    got = top_sites({"locations": locs})
    assert got == {"n": 4, "first_token": 0.5, "second_map": 0.75, "layers": [1, 3, 4]}
    hidden = top_sites({"locations": [{"layer": 0, "position": 0}, {"layer": 2, "position": 5}]})
    assert hidden == {"n": 2, "first_token": 0.5, "layers": [0, 2]}


def result(seed: int, logit_ratio: float, advantage: float, gate: bool = True) -> dict:
    adv = {"attn_logits/tensor tinystories": {"advantage": advantage, "low": advantage - 0.1,
                                              "high": advantage + 0.1}}
    return {**PAIR, "pair": f"s{seed}", "seed": seed, "gate": gate,
            "versus": {"diff": {"logit_ratio": logit_ratio, "hidden_ratio": 1.0 / logit_ratio,
                                "advantage_4bit": adv}}}


def test_over_seeds_pools_per_seed_ratios_and_advantages():
    results = [result(s, r, a) for s, r, a in ((0, 2.0, 0.1), (1, 4.0, -0.05), (2, 0.5, 0.2))]
    (entry,) = seeds.over_seeds(results)
    assert entry["seeds"] == [0, 1, 2] and entry["other"] == "diff"
    assert entry["logit_ratio"]["geomean"] == pytest.approx((2.0 * 4.0 * 0.5) ** (1 / 3))
    assert entry["logit_ratio"]["sign_test"]["positive"] == 2  # ratios > 1, tested on their logs
    pooled = entry["advantage_4bit"]["attn_logits/tensor tinystories"]
    assert pooled["per_seed"] == [0.1, -0.05, 0.2] and pooled["pooled"]["mean"] == pytest.approx(0.25 / 3)
    text = seeds.seeds_table(seeds.over_seeds(results))
    assert "2.00 / 4.00 / 0.50" in text and "+0.083" in text
    assert "0 / 1 / 2" in text and "not gated" not in text
    results[1] = result(1, 4.0, -0.05, gate=False)
    assert "0 / 1 / 2 (not gated: 1)" in seeds.seeds_table(seeds.over_seeds(results))


def test_plot_tracked_draws_arms_and_ratios_from_train_logs(tmp_path):
    from diffquant.plots import plot_tracked

    def log(scale: float) -> dict:
        points = [{"tokens": t, "layers": [{"layer": i, "attn_logits": {"top1": scale * t * (i + 1)},
                                             "hidden": {"top1": scale + i}} for i in range(3)]}
                  for t in (1000, 2000, 3000)]
        return {"history": {"outliers": points}}

    path = plot_tracked({"transformer": log(2.0), "diff": log(1.0), "diff cooled": log(0.5)}, tmp_path / "t.png")
    assert path.stat().st_size > 10_000


def test_trend_lines_join_only_cooled_budgets_of_one_run(monkeypatch, tmp_path):
    drawn = {}
    monkeypatch.setattr(trend, "plot_trend", lambda series, path, paper, scheme: drawn.update(series, paper=paper))
    scheme = f"{trend.TREND_SCHEME} (first 48)"
    pairs = [{**PAIR, "pair": name, "run": run, "tokens": tokens, "cooled": cooled, "gate": tokens != 40,
              "versus": {"diff": {"logit_ratio": tokens / 10, "hidden_ratio": 1.0,
                                  "advantage_4bit": {scheme: {"advantage": -0.1, "low": -0.2, "high": 0.0},
                                                     "attn_logits/head test": {}}}}}
             for name, run, tokens, cooled in (("a-6M", "lr1e-2", 6, True), ("b-40M", "lr3e-3", 40, True),
                                               ("b-80M", "lr3e-3", 80, True), ("b-raw", "lr3e-3", 90, False))]
    trend.plot_verdict_trend(pairs, tmp_path / "trend.png")
    assert [q["tokens"] for q in drawn["lr3e-3"]] == [40, 80]  # the uncooled budget stays out
    assert [q["gate"] for q in drawn["lr3e-3"]] == [False, True]
    assert [q["logit_ratio"] for q in drawn["lr1e-2"]] == [0.6]
    assert drawn["lr3e-3"][0]["advantage"] == {"advantage": -0.1, "low": -0.2, "high": 0.0}
    assert drawn["paper"] == pytest.approx((318.0 / 38.8, 3608.6 / 1688.2))  # Table 5's 8.2× and 2.1×


def test_trend_table_lists_each_cooled_budget_with_its_intervals():
    rng = random.Random(3)
    schemes = [f"{prefix} (first 48)" for _, prefix in trend.TREND_ADVANTAGES]
    pairs = []
    for run, tokens, cooled in (("b", 80, True), ("b", 40, True), ("b", 90, False), ("a", 6, True)):
        advs = {s: {"advantage": (a := rng.uniform(-0.5, 0.5)), "low": a - 0.05, "high": a + 0.05}
                for s in schemes[:-1]}  # the last scheme never measured: a dash, not a number
        pairs.append({**PAIR, "pair": f"{run}-{tokens}", "run": run, "tokens": tokens, "cooled": cooled,
                      "gate": tokens > 10, "ppl_growth_4bit": {"transformer": {SEQUENCE: rng.uniform(2, 3)},
                                          "diff": {SEQUENCE: rng.uniform(3, 4)}},
                      "versus": {"diff": {"logit_ratio": rng.uniform(0.5, 2), "hidden_ratio": rng.uniform(0.5, 2),
                                          "advantage_4bit": advs}}})
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in trend.trend_table(pairs).splitlines()[2:]]
    # runs in the order of their first budget, each by tokens; cooled budgets only
    assert [row[:3] for row in rows] == [["a", "6", "no"], ["b", "40", "yes"], ["b", "80", "yes"]]
    cells = rows[1][:2] + rows[1][3:]
    p40 = pairs[1]
    vs, growth = p40["versus"]["diff"], p40["ppl_growth_4bit"]
    assert float(cells[2]) == pytest.approx(vs["logit_ratio"], rel=1e-3)
    assert float(cells[3]) == pytest.approx(vs["hidden_ratio"], rel=1e-3)
    assert cells[4] == f"{growth['transformer'][SEQUENCE]:.2f} / {growth['diff'][SEQUENCE]:.2f}"
    first = vs["advantage_4bit"][schemes[0]]
    assert cells[5] == f"{first['advantage']:+.3f} [{first['low']:+.3f}, {first['high']:+.3f}]"
    assert cells[-1] == "—"


def test_trend_figure_is_drawn(tmp_path):
    from diffquant.plots import plot_trend

    series = {f"run {i}": [{"tokens": t, "logit_ratio": 1.0 + i, "hidden_ratio": 0.9,
                            "advantage": {"advantage": -0.2, "low": -0.3, "high": -0.1} if t > 10 else None}
                           for t in (6e6, 4e7, 8e7)] for i in range(3)}
    assert plot_trend(series, tmp_path / "trend.png", paper=(8.2, 2.1), scheme="s").stat().st_size > 10_000


def test_series_styles_stay_distinct_past_the_colour_cycle():
    from diffquant.plots import series_style

    styles = [tuple(series_style(i).values()) for i in range(100)]
    assert len(set(styles)) == 100  # eleven runs once drew the 1st and 11th alike


def test_trend_figure_draws_ungated_points_hollow(monkeypatch, tmp_path):
    from diffquant import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    advantage = {"advantage": -0.2, "low": -0.3, "high": -0.1}
    series = {"gated run": [{"tokens": t, "logit_ratio": 1.3, "hidden_ratio": 0.9, "advantage": advantage}
                            for t in (4e7, 8e7)],
              "ungated run": [{"tokens": t, "logit_ratio": 1.2, "hidden_ratio": 0.8, "advantage": advantage,
                               "gate": t > 5e7} for t in (4e7, 8e7)]}
    plots.plot_trend(series, tmp_path / "trend.png")

    def hollow(ax) -> list[tuple]:
        return [tuple(line.get_xdata()) for line in ax.get_lines() if line.get_markerfacecolor() == "white"]

    axes = figures[0].axes
    assert [hollow(ax) for ax in axes] == [[(4e7,)]] * 3  # only the ungated point, in every panel
    labels = [t.get_text() for t in figures[0].legends[0].get_texts()]
    plots.plt.close(figures[0])
    assert labels == ["gated run", "ungated run", "hollow: Transformer below the gate"]


def test_log_axis_labels_only_spaced_minor_ticks():
    from diffquant.plots import _sparse_log_label

    labels = [_sparse_log_label(v, 0) for v in (0.2, 0.3, 0.4, 0.5, 0.9, 2.0, 3.0, 5.0, 8.0, 9.0, 30.0)]
    assert labels == ["0.2", "0.3", "", "0.5", "", "2", "3", "5", "", "", "30"]


@pytest.fixture
def verdicts_script(tmp_path, monkeypatch):
    """experiments/campaign/verdicts.py with its run folders under tmp_path."""
    from pathlib import Path

    from .helpers import load_script

    verdicts = load_script(Path(__file__).resolve().parents[1] / "experiments" / "campaign" / "verdicts.py")
    monkeypatch.setattr(verdicts, "REPO", tmp_path)
    monkeypatch.setattr(verdicts, "LONG_ROOT", tmp_path / "long")
    monkeypatch.setattr(verdicts, "ABLATION_ROOT", tmp_path / "ablation")
    monkeypatch.setattr(verdicts, "STREAMED_ROOT", tmp_path / "streamed")
    return verdicts


def cooled(run, arms, branch: str = "step004096", tokens: int = 41943040, parked: bool = False) -> None:
    """Stand-ins for the cooled checkpoints of ``arms`` in a run folder (``parked``: config.json without weights)."""
    for arch in arms:
        final = run / "cooldown" / f"{arch}-{branch}" / "final"
        final.mkdir(parents=True)
        (final / "config.json").write_text("{}")
        if not parked:
            (final / "model.safetensors").write_bytes(b"x")
        (final.parent / "train_log.json").write_text(json.dumps({"tokens_seen": tokens}))


def test_verdicts_finds_each_long_seeds_cooled_pairs_with_its_seed(tmp_path, verdicts_script):
    from pathlib import Path

    verdicts = verdicts_script
    for run, arms in (("xs-lr3e-3-s10", ("transformer", "diff")), ("xs-lr3e-3-s1", ("transformer", "diff")),
                      ("xs-lr3e-3-s2", ("transformer",)),  # seed 2's Diff arm still cooling: no pair
                      ("s-lr3e-3-s0", ("transformer", "diff")), ("s-lr1e-2-s0", ("transformer", "diff"))):
        cooled(tmp_path / "long" / run, arms)
    (tmp_path / "long" / "notes-lr-s").mkdir()  # not a run's name: ignored
    pairs = verdicts.long_pairs()
    assert [(p["pair"], p["preset"], p["seed"], p["run"]) for p in pairs] == [
        ("s-lr1e-2-s0-41.9M", "s", 0, "s-lr1e-2-s0"), ("s-lr3e-3-s0-41.9M", "s", 0, "s-lr3e-3-s0"),
        ("xs-lr3e-3-s1-41.9M", "xs", 1, "xs-lr3e-3-s1"), ("xs-lr3e-3-s10-41.9M", "xs", 10, "xs-lr3e-3-s10")]
    assert [p["budget"] for p in pairs[:3]] == ["41.9M @ lr 1e-2", "41.9M @ lr 3e-3", "41.9M @ lr 3e-3"]
    assert pairs[2]["budget"] == pairs[3]["budget"]  # seeds of one budget are pooled over seeds
    assert pairs[2]["checkpoints"]["diff"] == "long/xs-lr3e-3-s1/cooldown/diff-step004096/final"
    assert [verdicts.emergence_suffix(run) for run in verdicts.long_runs()] == [
        "-s-lr1e-2-s0", "-s-s0", "-s1", "-s2", "-s10"]
    assert verdicts.emergence_suffix(Path("xs-lr3e-3-s0")) == ""  # seed 0 keeps the first figure's name


def test_verdicts_pairs_each_ablation_with_its_own_or_the_long_runs_transformer(tmp_path, verdicts_script):
    cooled(tmp_path / "long" / "xs-lr3e-3-s0", ("transformer", "diff"))
    cooled(tmp_path / "ablation" / "xs-lr3e-3-s0-lambda0.8", ("diff",))
    cooled(tmp_path / "ablation" / "xs-lr3e-3-s0-init-default", ("transformer", "diff"))
    cooled(tmp_path / "ablation" / "xs-lr3e-3-s1-lambda0.8", ("diff",))  # no seed-1 Transformer to pair with
    pairs = {p["pair"]: p for p in verdicts_script.ablation_pairs()}
    assert set(pairs) == {"xs-lr3e-3-s0-lambda0.8-41.9M", "xs-lr3e-3-s0-init-default-41.9M"}
    lam, init = pairs["xs-lr3e-3-s0-lambda0.8-41.9M"], pairs["xs-lr3e-3-s0-init-default-41.9M"]
    assert lam["checkpoints"] == {"transformer": "long/xs-lr3e-3-s0/cooldown/transformer-step004096/final",
                                  "diff": "ablation/xs-lr3e-3-s0-lambda0.8/cooldown/diff-step004096/final"}
    assert init["checkpoints"]["transformer"].startswith("ablation/xs-lr3e-3-s0-init-default/")
    assert (lam["seed"], lam["preset"]) == (0, "xs") and "λ_init 0.8" in lam["budget"]
    assert len({lam["budget"], init["budget"], "41.9M @ lr 3e-3"}) == 3  # never pooled with the long seeds


def test_verdicts_name_and_budget_a_streamed_pair_apart_from_the_corpus_run_of_its_seed(tmp_path, verdicts_script):
    verdicts = verdicts_script
    cooled(tmp_path / "long" / "s-lr3e-3-s0", ("transformer", "diff"))
    cooled(tmp_path / "streamed" / "s-lr3e-3-s0", ("transformer", "diff"))
    cooled(tmp_path / "streamed" / "s-lr3e-3-s1", ("transformer",))  # its Diff still training: no pair
    [corpus], [streamed] = verdicts.long_pairs(), verdicts.streamed_pairs()
    assert (streamed["pair"], streamed["budget"]) == ("s-lr3e-3-s0-streamed-41.9M", "41.9M @ lr 3e-3, streamed")
    assert (corpus["pair"], corpus["budget"]) == ("s-lr3e-3-s0-41.9M", "41.9M @ lr 3e-3")
    assert (streamed["run"], corpus["run"]) == ("s-lr3e-3-s0-streamed", "s-lr3e-3-s0")  # trend.md's lines apart
    assert streamed["checkpoints"]["diff"] == "streamed/s-lr3e-3-s0/cooldown/diff-step004096/final"
    assert (streamed["preset"], streamed["seed"]) == ("s", 0)


def test_verdicts_find_a_pair_whose_weights_are_parked_and_name_the_command_that_restores_them(
        tmp_path, verdicts_script, monkeypatch):
    verdicts = verdicts_script
    cooled(tmp_path / "long" / "xs-lr3e-3-s0", ("transformer", "diff"), parked=True)
    cooled(tmp_path / "long" / "xs-lr3e-3-s1", ("transformer",), parked=True)
    (tmp_path / "long" / "xs-lr3e-3-s1" / "cooldown" / "diff-step004096").mkdir()  # cooling: no final yet
    states = {"runs": {"long/xs-lr3e-3-s0": [{"commit": "c1", "paths": ["diff/state"]}],
                       "long/xs-lr3e-3-s0/cooldown/transformer-step004096/final": [
                           {"commit": "c2", "paths": ["model.safetensors"]}],
                       "long/xs-lr3e-3-s0/cooldown/diff-step004096": [{"commit": "c3", "paths": ["final"]}]}}
    (tmp_path / "states.json").write_text(json.dumps(states))
    monkeypatch.setattr(verdicts, "STATES", tmp_path / "states.json")
    [pair] = verdicts.long_pairs()
    assert pair["pair"] == "xs-lr3e-3-s0-41.9M"
    assert verdicts.restore_command(pair) == ("bash experiments/campaign/restore_states.sh "
                                              "long/xs-lr3e-3-s0/cooldown/transformer-step004096/final "
                                              "long/xs-lr3e-3-s0/cooldown/diff-step004096")
    saved = tmp_path / "table5.json"
    with pytest.raises(SystemExit, match="lacks its profile; restore its weights with: bash "):
        with verdicts.needs_weights(pair):
            verdicts.table5_record(pair, None, saved, 1)
    cached = {arch: {"lambda": None, "top": [1.0]} for arch in ("transformer", "diff")}
    saved.write_text(json.dumps(cached))
    assert verdicts.table5_record(pair, None, saved, 1) == cached  # the cached profile serves without weights


def mc_record(arch: str, task: str, share: float, seed: int, n: int = 200, bits: int = 16) -> dict:
    """A multiple-choice record whose predictions copy the gold answer with probability ``share``."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        gold = rng.randrange(2)
        pred = gold if rng.random() < share else rng.randrange(2)
        items.append({"gold": gold, "predicted": pred, "predicted_norm": rng.randrange(2), "ll": [0.0, 0.0]})
    return {"arch": arch, "task": task, "bits": bits, "kind": "multiple_choice", "metrics": {"items": items}}


def test_zeroshot_counts_a_task_only_when_every_arm_is_above_chance_after_bonferroni():
    pair = {"pair": "p", "tokens": 10, "checkpoints": {"transformer": "t", "diff": "d"}}
    records = [mc_record("transformer", "copa", 0.6, 1), mc_record("diff", "copa", 0.6, 2),
               mc_record("transformer", "piqa", 0.6, 3), mc_record("diff", "piqa", 0.0, 4),
               mc_record("transformer", "copa", 0.0, 5, bits=4)]  # quantized records are not tested
    v = zeroshot.zeroshot_verdict(pair, records, n_permutations=2_000)
    assert len(v["tests"]) == 8 and v["threshold"] == pytest.approx(0.05 / 8)
    assert v["above_chance"] == ["copa"]  # piqa: the Diff arm guesses
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in zeroshot.zeroshot_table([v]).splitlines()[2:]]
    assert [row[1:4] + row[-1:] for row in rows] == [
        ["copa", "transformer", "200", "yes"], ["copa", "diff", "200", "yes"],
        ["piqa", "transformer", "200", "no"], ["piqa", "diff", "200", "no"]]


def test_zeroshot_end_to_end_on_tiny_checkpoints(tmp_path):
    import diffquant as dq

    from .conftest import tiny_config
    from .helpers import randomize_

    torch.manual_seed(0)
    models = {arch: randomize_(dq.build_model(tiny_config(arch, vocab_size=8192))) for arch in ("transformer", "diff")}
    ckpts = {arch: str(dq.save_checkpoint(model, tmp_path / arch)) for arch, model in models.items()}
    pair = {"pair": "tiny", "tokens": 1, "checkpoints": ckpts}
    path = zeroshot.zeroshot_path(tmp_path, pair)
    records = zeroshot.zeroshot_pair(pair, path, tasks={"copa": 8}, batch_size=4)
    assert path.name == "tiny.jsonl.gz" and gzip.decompress(path.read_bytes()).count(b"\n") == 2
    assert sorted(r["arch"] for r in records) == ["diff", "transformer"] and {r["bits"] for r in records} == {16}
    v = zeroshot.zeroshot_verdict(pair, records, n_permutations=500)
    assert len(v["tests"]) == 4 and all(t["n"] == 8 for t in v["tests"])
    outputs.write_zeroshot(tmp_path, [v], lambda _: records)
    assert json.loads((tmp_path / "zeroshot.json").read_text())[0]["pair"] == "tiny"
    assert (tmp_path / "zeroshot.md").read_text().count("| tiny ") == 2


def test_study_records_are_written_compressed_and_older_plain_ones_still_found(tmp_path):
    from diffquant.study.figure8 import records_path, sweep_path

    assert sweep_path(tmp_path, {"pair": "p"}) == tmp_path / "figure8" / "p.jsonl.gz"
    (tmp_path / "old.jsonl").write_text("")
    assert records_path(tmp_path, "old") == tmp_path / "old.jsonl"  # an older output, read where it is
    (tmp_path / "old.jsonl.gz").write_bytes(b"")
    assert records_path(tmp_path, "old") == tmp_path / "old.jsonl.gz"  # both: the compressed one is today's


def test_profiles_are_written_compressed_and_older_plain_ones_still_found(tmp_path):
    from diffquant.study.table5 import profile_path

    assert profile_path(tmp_path, "p") == tmp_path / "table5" / "p.json.gz"
    (tmp_path / "table5").mkdir()
    (tmp_path / "table5" / "old.json").write_text("{}")
    assert profile_path(tmp_path, "old") == tmp_path / "table5" / "old.json"  # the H200 run's, read where it is


def test_a_sweep_of_parked_weights_reuses_complete_records_and_refuses_new_cells(tmp_path):
    import diffquant as dq
    from diffquant.checkpoint.files import WeightsParked, parked_weights, weights_here
    from diffquant.study.figure8 import sweep_or_reuse

    from .conftest import tiny_config
    from .helpers import randomize_

    torch.manual_seed(1)
    ckpts = [str(dq.save_checkpoint(randomize_(dq.build_model(tiny_config(arch, vocab_size=8192))), tmp_path / arch))
             for arch in ("transformer", "diff")]
    out = tmp_path / "f8.jsonl"
    cells = {"bits": (16, 4), "tasks": ["tinystories"], "granularity": "head", "limit": 2}
    assert len(missing_cells(ckpts, out, "attn_logits", **cells)) == 4  # nothing scored yet
    sweep_or_reuse(ckpts, out, "attn_logits", batch_size=2, device="cpu", **cells)
    scored = out.read_bytes()
    assert missing_cells(ckpts, out, "attn_logits", **cells) == []
    assert missing_cells(ckpts, out, "attn_logits", **{**cells, "granularity": "sequence"}) == [
        (ckpts[0], 4, "tinystories"), (ckpts[1], 4, "tinystories")]  # 16 bits is shared by every granularity
    (Path(ckpts[1]) / "model.safetensors").unlink()  # parked: config.json and the tokenizer stay
    assert weights_here(ckpts[0]) and not weights_here(ckpts[1])
    relative = [str(Path(c).relative_to(tmp_path)) for c in ckpts]
    assert parked_weights(ckpts) == [ckpts[1]] and parked_weights(relative, tmp_path) == ["diff"]
    sweep_or_reuse(ckpts, out, "attn_logits", batch_size=2, device="cpu", **cells)  # complete: reused as is
    assert out.read_bytes() == scored
    with pytest.raises(WeightsParked, match="diff has no weights here .* lacks 2 of the pair's cells"):
        sweep_or_reuse(ckpts, out, "attn_logits", batch_size=2, device="cpu", **{**cells, "bits": (16, 8, 4)})
    assert out.read_bytes() == scored


def test_diff_lambdas_are_each_layers_lambda_and_the_gate_table_gives_their_range():
    from diffquant import ModelConfig, build_model

    diff = build_model(ModelConfig.preset("tiny", arch="diff"), seed=0)
    with torch.no_grad():
        diff.layers[1].attn.lambda_q2.fill_(0.3)  # λ = e^(q1·k1) − e^(q2·k2) + λ_init, pushed below zero
        diff.layers[1].attn.lambda_k2.fill_(0.3)
    lambdas = diff_lambdas(diff)
    with torch.no_grad():
        by_hand = [math.exp(float((a.lambda_q1.double() * a.lambda_k1.double()).sum()))
                   - math.exp(float((a.lambda_q2.double() * a.lambda_k2.double()).sum())) + a.lambda_init
                   for a in (layer.attn for layer in diff.layers)]
    assert lambdas == pytest.approx(by_hand, rel=1e-5) and lambdas[1] < 0 < lambdas[0]
    assert diff_lambdas(build_model(ModelConfig.preset("tiny"), seed=0)) is None
    result = {"pair": "p", "tokens": 10, "gate": True, "logit_top1": {"transformer": 120.0, "diff": 60.0},
              "ppl_growth_4bit": {"transformer": {SEQUENCE: 3.0}, "diff": {SEQUENCE: 2.0}},
              "checkpoints": {"transformer": "t", "diff": "d"}, "lambda": {"diff": lambdas}}
    assert f"D {lambdas[1]:.2f} … {lambdas[0]:.2f} (< 0: L1)" in gate.gate_table([result])
    in_range = gate.gate_table([{**result, "lambda": {"diff": lambdas[:1]}}]).splitlines()[-1].split("|")[-3]
    assert in_range.strip() == f"D {lambdas[0]:.2f} … {lambdas[0]:.2f}"
    assert gate.gate_table([{**result, "lambda": {}}]).splitlines()[-1].split("|")[-3].strip() == "-"


def test_verdicts_adds_lambda_to_table5_records_saved_without_it(tmp_path, verdicts_script):
    from diffquant import ModelConfig, build_model, save_checkpoint

    ckpts = {}
    for arch in ("transformer", "diff"):
        save_checkpoint(build_model(ModelConfig.preset("tiny", arch=arch), seed=1), tmp_path / arch)
        ckpts[arch] = str(tmp_path / arch)
    saved = tmp_path / "table5.json"
    known = {arch: {"sites": {}} for arch in ckpts}
    filled = verdicts_script.with_lambdas(known, {"checkpoints": ckpts}, saved)
    assert filled["transformer"]["lambda"] is None and len(filled["diff"]["lambda"]) == 2
    assert json.loads(saved.read_text()) == filled and "lambda" not in known["diff"]  # the caller's dict is kept
    saved.unlink()
    assert verdicts_script.with_lambdas(filled, {"checkpoints": {}}, saved) is filled and not saved.exists()


def val_log(losses: dict[int, float], tokens_per_step: int = 8192, corpus_tokens: int | None = None) -> dict:
    """A train log with validation points at ``losses``' steps (and the corpus size a corpus run records)."""
    val = [{"step": s, "tokens": s * tokens_per_step, "loss": loss} for s, loss in losses.items()]
    return {"history": {"val": val}, "data": {"corpus_tokens": corpus_tokens} if corpus_tokens else {"streamed": True}}


def test_fresh_curves_set_each_streamed_arm_beside_its_corpus_arm_at_equal_tokens():
    from diffquant.study.fresh_curves import fresh_curve_rows

    fresh = {s: random.uniform(2, 3) for s in (512, 1024, 1536)}
    cycled = {s: random.uniform(2, 3) for s in (512, 1024, 2048)}
    corpus_tokens = random.randint(3_000_000, 9_000_000)
    streamed = {"transformer": val_log(fresh), "diff": val_log({512: 4.0}, tokens_per_step=4096)}
    corpus = {"transformer": val_log(cycled, corpus_tokens=corpus_tokens),
              "diff": val_log({512: 3.0}, corpus_tokens=corpus_tokens)}
    rows = fresh_curve_rows("run", streamed, corpus)
    assert [r[2] for r in rows] == [512, 1024]  # steps both reached; the Diff's other batch size: no row
    for row, step in zip(rows, (512, 1024), strict=True):
        assert row[:2] == ["run", "T"] and row[4] == f"{step * 8192 / corpus_tokens:.2f}"
        assert row[5:] == [f"{fresh[step]:.3f}", f"{cycled[step]:.3f}", f"{fresh[step] - cycled[step]:+.3f}"]


def test_verdicts_write_fresh_curves_for_a_streamed_run_with_a_corpus_run(tmp_path, verdicts_script):
    from diffquant.study.outputs import write_fresh_curves

    verdicts = verdicts_script
    for root, losses in (("long", {512: 2.5, 1024: 2.3}), ("streamed", {512: 2.4, 1024: 2.1})):
        for arch in ("transformer", "diff"):
            (tmp_path / root / "s-lr3e-3-s0" / arch).mkdir(parents=True)
            (tmp_path / root / "s-lr3e-3-s0" / arch / "train_log.json").write_text(json.dumps(val_log(losses)))
    (tmp_path / "streamed" / "xs-lr3e-3-s1" / "transformer").mkdir(parents=True)  # no corpus run: no rows
    (tmp_path / "streamed" / "xs-lr3e-3-s1" / "transformer" / "train_log.json").write_text(json.dumps(val_log({})))
    fresh = verdicts.fresh_runs(verdicts.run_logs())
    assert list(fresh) == ["s-lr3e-3-s0-streamed"]
    write_fresh_curves(tmp_path, fresh)
    text = (tmp_path / "fresh_curves.md").read_text()
    assert text.count("| s-lr3e-3-s0-streamed |") == 4 and "| -0.200 " in text and "| -0.100 " in text
