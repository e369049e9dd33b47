"""Outlier-regime verdicts: the gate, each pair's Table 5 and Figure 8, and the statistics over seeds.

A *pair* is a dict naming checkpoints trained with identical data order::

    {"pair": "xs-s0-6.03M", "preset": "xs", "seed": 0, "budget": "6.03M", "tokens": 6029312, "cooled": True,
     "checkpoints": {"transformer": ".../final", "diff": ".../final", ...}}

with a ``transformer`` arm and one or more others (diff, gated, clipped), each set against the Transformer.
The **gate**: no Table-5 or Figure-8 verdict counts unless the Transformer is in the outlier regime:
attention-logit top-1 ≥ 100 and 4-bit per-sequence logits at least doubling its perplexity on the real
TinyStories held-out text. Everything here is computed from records; tables and plots are made from them.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
from scipy.stats import binomtest
from scipy.stats import t as student_t

from .arches import ArchColumn
from .chance import PREDICTION, above_chance
from .checkpoint import load_checkpoint
from .emergence import BLOCK_KEYS, CURVES, FLAT_BLOCKS, FLAT_CHANGE, has_flattened, recent_changes
from .io import atomic_write_text, read_json_file
from .kinds import ATTN_LOGITS, HIDDEN, SEQUENCE
from .plots import plot_trend as draw_trend
from .profile import profile, token_batches
from .records import read_records
from .report import comparison_rows, render_report
from .sweep import run_sweep
from .tables import PAPER_TABLE5, outlier_table, ratio_table, render
from .tracking import diff_lambdas

log = logging.getLogger(__name__)

GATE_LOGIT_TOP1, GATE_PPL_FACTOR = 100.0, 2.0
GATE_TASK = "tinystories"
BITS = (16, 8, 6, 4)
GRANULARITIES = (SEQUENCE, "head", "head_map")  # per sequence; per head (Diff maps share); per head and map
LOCATED = 100  # top values whose positions are summarised
ARCH_SHORT = ArchColumn("short")  # arch -> one letter (diffquant/arches.py); its order is the table's
# zero-shot tasks (items: the first N; COPA has 100) checked for above-chance accuracy before their Figure 8
ZEROSHOT_TASKS = {"copa": None, "piqa": 500, "winogrande": 500, "arc_easy": 500, "openbookqa": 500, "boolq": 500,
                  "hellaswag": 200}
ZEROSHOT_ALPHA = 0.05  # family-wise, Bonferroni over every (task, arm, metric) of a pair


def tokens_label(tokens: int | None) -> str:
    if tokens is None:
        return "—"  # not known (a checkpoint without its training log)
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if tokens >= size:
            return f"{tokens / size:.3g}{unit}"
    return str(tokens)


def others(pair: dict) -> list[str]:
    """The arms set against the Transformer, in a stable order."""
    return sorted((a for a in pair["checkpoints"] if a != "transformer"), key=list(ARCH_SHORT).index)


# ------------------------------------------------------------------------------------------------ measuring

def profile_pair(pair: dict, ids: np.ndarray, seq_len: int, batch_size: int, max_tokens: int | None = None,
                 device: str = "cpu", out: Path | None = None) -> dict[str, dict]:
    """Table-5 records of every arm on ``ids`` (global protocol, exact medians, top-100 located)."""
    records = {}
    batches = token_batches(ids, seq_len, batch_size, max_tokens)  # the same windows for every arm
    for arch, path in pair["checkpoints"].items():
        model = load_checkpoint(path, device=device)
        report = profile(model, batches, label=f"{pair['pair']}-{arch}", exact_median=True, n_locations=LOCATED,
                         progress=False)
        records[arch] = {**report.data, "train_tokens": pair["tokens"], "lambda": diff_lambdas(model)}
    if out is not None:
        atomic_write_text(Path(out), json.dumps(records, indent=1))
    return records


def sweep_pair(pair: dict, path: Path, tasks: dict[str, int | None], batch_size: int = 32, device: str = "cpu",
               bits=BITS, granularities=GRANULARITIES) -> list[dict]:
    """Figure-8 records (resumable JSONL at ``path``): attention logits at ``bits``, every granularity and task."""
    for granularity in granularities:
        for task, limit in tasks.items():
            run_sweep(list(pair["checkpoints"].values()), path, ATTN_LOGITS, bits=bits, tasks=[task],
                      granularity=granularity, limit=limit, batch_size=batch_size, device=device, progress=False)
    return read_records(path)


def zeroshot_pair(pair: dict, path: Path, tasks: dict[str, int | None] = ZEROSHOT_TASKS, batch_size: int = 32,
                  device: str = "cpu") -> list[dict]:
    """Unquantized zero-shot records of every arm (resumable JSONL at ``path``), for :func:`zeroshot_verdict`."""
    for task, limit in tasks.items():
        run_sweep(list(pair["checkpoints"].values()), path, ATTN_LOGITS, bits=(16,), tasks=[task], limit=limit,
                  batch_size=batch_size, device=device, progress=False)
    return read_records(path)


def zeroshot_check(pair: dict, path: Path, tasks: dict[str, int | None] = ZEROSHOT_TASKS, batch_size: int = 32,
                   device: str = "cpu") -> dict:
    """:func:`zeroshot_verdict` on freshly scored (or resumed) records, then Figure 8 on the tasks above chance,
    all in the JSONL at ``path``."""
    verdict = zeroshot_verdict(pair, zeroshot_pair(pair, path, tasks, batch_size, device))
    log.info("pair %s: above chance on %s", pair["pair"], ", ".join(verdict["above_chance"]) or "no task")
    if verdict["above_chance"]:
        sweep_pair(pair, path, {t: tasks[t] for t in verdict["above_chance"]}, batch_size, device)
    return verdict


# ------------------------------------------------------------------------------------------------ verdicts

def zeroshot_verdict(pair: dict, records: list[dict], alpha: float = ZEROSHOT_ALPHA,
                     n_permutations: int = 20_000) -> dict:
    """Which zero-shot tasks every arm of ``pair`` answers above chance (:func:`~diffquant.chance.above_chance`
    on the unquantized records, acc and acc_norm), at family-wise level ``alpha`` (Bonferroni). A task counts
    when, for one metric, every arm passes: only there is a Figure-8 accuracy comparison more than noise."""
    tests = [{"task": r["task"], "arch": r["arch"], **above_chance(r["metrics"]["items"], metric, n_permutations)}
             for r in records if r["bits"] == 16 and r["kind"] == "multiple_choice" for metric in PREDICTION]
    threshold = alpha / max(1, len(tests))
    arms = set(pair["checkpoints"])
    passing = sorted(task for task in {t["task"] for t in tests}
                     if any({t["arch"] for t in tests if (t["task"], t["metric"]) == (task, metric)
                             and t["p"] <= threshold} == arms for metric in PREDICTION))
    return {"pair": pair["pair"], "tokens": pair["tokens"], "alpha": alpha, "threshold": threshold,
            "n_permutations": n_permutations, "tests": tests, "above_chance": passing}


def perplexity(records: list[dict], arch: str, bits: int, granularity: str | None, task: str) -> float | None:
    for rec in records:
        if (rec["arch"], rec["bits"], rec.get("granularity"), rec["task"]) == (arch, bits, granularity, task):
            return rec["metrics"]["perplexity"]
    return None


def ppl_growth(records: list[dict], arch: str, granularity: str = SEQUENCE, bits: int = 4,
               task: str = GATE_TASK) -> float | None:
    """Perplexity with ``bits``-bit logits over the unquantized one."""
    base = perplexity(records, arch, 16, None, task)
    quant = perplexity(records, arch, bits, granularity, task)
    return quant / base if base and quant else None


def top_sites(site: dict) -> dict:
    """Where the located top values sit: the share whose key (or position) is the first token, and for Diff
    logits the share in the second map (Q2K2ᵀ)."""
    locs = site.get("locations", [])
    if not locs:
        return {"n": 0}
    first = [loc.get("key", loc.get("position")) == 0 for loc in locs]
    out = {"n": len(locs), "first_token": sum(first) / len(locs),
           "layers": sorted({loc["layer"] for loc in locs})}
    if "map" in locs[0]:
        out["second_map"] = sum(loc["map"] == 1 for loc in locs) / len(locs)
    return out


def verdict(pair: dict, table5: dict[str, dict], records: list[dict]) -> dict:
    """The gate, every arm's top-1s, 4-bit growths and top sites, and each other arm against the Transformer:
    Table-5 ratios (Transformer / other) and 4-bit degradation advantages with paired bootstrap intervals."""
    def top1(arch: str, kind: str) -> float:
        return table5[arch]["sites"][kind]["top"][0]

    arms = list(pair["checkpoints"])
    growth = {arch: {g: ppl_growth(records, arch, g) for g in GRANULARITIES} for arch in arms}
    gate = top1("transformer", ATTN_LOGITS) >= GATE_LOGIT_TOP1 and \
        (growth["transformer"][SEQUENCE] or 0) >= GATE_PPL_FACTOR
    rows = [c for c in comparison_rows(records) if c.bits == 4]
    versus = {}
    for other in others(pair):
        versus[other] = {
            "logit_ratio": top1("transformer", ATTN_LOGITS) / top1(other, ATTN_LOGITS),
            "hidden_ratio": top1("transformer", HIDDEN) / top1(other, HIDDEN),
            "advantage_4bit": {f"{c.scheme} {c.task}": {"advantage": c.advantage, "low": c.low, "high": c.high}
                               for c in rows if c.candidate_arch == other},
        }
    return {**pair, "gate": gate,
            "logit_top1": {arch: top1(arch, ATTN_LOGITS) for arch in arms},
            "hidden_top1": {arch: top1(arch, HIDDEN) for arch in arms},
            "lambda": {arch: table5[arch]["lambda"] for arch in arms if table5[arch].get("lambda")},
            "top_sites": {arch: {kind: top_sites(table5[arch]["sites"][kind]) for kind in (ATTN_LOGITS, HIDDEN)}
                          for arch in arms},
            "ppl_growth_4bit": growth, "versus": versus, "memorisation": memorisation_of(pair)}


def memorisation_of(pair: dict) -> dict[str, dict]:
    """Each arm's memorisation check from its train log (``diffquant.stream``): whether its data was streamed,
    and the fresh − training loss gap with its standard error where the log has one."""
    out = {}
    for arch, path in pair.get("train_logs", {}).items():
        if Path(path).is_file():
            record = read_json_file(path)
            out[arch] = {"streamed": bool(record.get("data", {}).get("streamed")),
                         **(record.get("memorisation") or {})}
    return out


# ------------------------------------------------------------------------------------------------ over seeds

def sign_test(values: list[float]) -> dict:
    """How many values are > 0 and the two-sided exact sign-test p (ties dropped)."""
    signs = [v > 0 for v in values if v != 0]
    p = binomtest(sum(signs), len(signs)).pvalue if signs else None
    return {"n": len(values), "positive": sum(signs), "p": p}


def mean_interval(values: list[float], level: float = 0.95) -> dict:
    """Mean over seeds with a Student-t interval (seeds are the unit of replication; n ≥ 2)."""
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    if len(x) < 2:
        return {"mean": mean, "low": None, "high": None, "n": len(x)}
    half = float(student_t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(x)}


def over_seeds(results: list[dict]) -> list[dict]:
    """Per (preset, budget, other arm): per-seed ratios and 4-bit advantages, sign tests and pooled means."""
    out = []
    keys = sorted({(r["preset"], r["budget"], r["tokens"], o) for r in results for o in r["versus"]},
                  key=lambda k: (k[0] != "xs", k[2], k[1], list(ARCH_SHORT).index(k[3])))  # no set order
    for preset, budget, tokens, other in keys:
        mine = sorted((r for r in results if (r["preset"], r["budget"]) == (preset, budget) and other in r["versus"]),
                      key=lambda r: r["seed"])
        vs = [r["versus"][other] for r in mine]
        entry = {"preset": preset, "budget": budget, "tokens": tokens, "other": other,
                 "seeds": [r["seed"] for r in mine], "gated": [r["gate"] for r in mine]}
        for key in ("logit_ratio", "hidden_ratio"):
            values = [v[key] for v in vs]
            entry[key] = {"per_seed": values, "sign_test": sign_test([math.log(x) for x in values]),
                          "geomean": float(np.exp(np.mean(np.log(values))))}
        entry["advantage_4bit"] = {}
        for scheme in sorted({s for v in vs for s in v["advantage_4bit"]}):
            values = [v["advantage_4bit"][scheme]["advantage"] for v in vs if scheme in v["advantage_4bit"]]
            entry["advantage_4bit"][scheme] = {"per_seed": values, "sign_test": sign_test(values),
                                               "pooled": mean_interval(values)}
        out.append(entry)
    return out


# ------------------------------------------------------------------------------------------------ tables

def fmt(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _arms(r: dict, values: dict, digits: int) -> str:
    return " / ".join(f"{ARCH_SHORT[a]} {fmt(values[a], digits)}" for a in r["checkpoints"])


def per_sequence(growth: dict) -> float | None:
    """The per-sequence entry of a growth dict (verdicts written before the rename call it "tensor")."""
    return growth[SEQUENCE] if SEQUENCE in growth else growth.get("tensor")


def yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def gate_table(results: list[dict]) -> str:
    rows = [[r["pair"], tokens_label(r["tokens"]), _arms(r, r["logit_top1"], 1),
             _arms(r, {a: per_sequence(g) for a, g in r["ppl_growth_4bit"].items()}, 2),
             yes_no(r["gate"]), lambda_ranges(r.get("lambda", {})), memorisation_cell(r.get("memorisation", {}))]
            for r in results]
    header = ["pair", "tokens", "logit top-1", "ppl × at 4-bit logits, per sequence",
              f"gate (T top-1 ≥ {GATE_LOGIT_TOP1:g}, T ppl × ≥ {GATE_PPL_FACTOR:g})", "Diff λ over layers",
              "memorisation: fresh − training loss (nats/token)"]
    return render(header, rows)


def memorisation_cell(memo: dict[str, dict]) -> str:
    """"streamed: none by construction" (with the measured gaps) when every arm was streamed; the arms' gaps
    ± standard error otherwise; "not measured" without checks."""
    gaps = " / ".join(f"{ARCH_SHORT[a]} {m['gap']:.3f} ± {fmt(m.get('se'), 3)}" for a, m in memo.items()
                      if "gap" in m)
    if memo and all(m["streamed"] for m in memo.values()):
        return "streamed: none by construction" + (f" ({gaps})" if gaps else "")
    return gaps or "not measured"


def lambda_ranges(lambdas: dict[str, list[float]]) -> str:
    """Each Diff arm's smallest and largest λ over layers, and the layers where λ < 0 (the second map is added)."""
    notes = []
    for arch, values in lambdas.items():
        negative = [f"L{i}" for i, v in enumerate(values) if v < 0]
        notes.append(f"{ARCH_SHORT.get(arch, arch)} {min(values):.2f} … {max(values):.2f}"
                     + (f" (< 0: {', '.join(negative)})" if negative else ""))
    return "; ".join(notes) or "-"


def sites_table(results: list[dict]) -> str:
    """Where the top-100 logits and hidden values sit, per pair and arm."""
    rows = []
    for r in results:
        for arch, sites in r["top_sites"].items():
            logit, hidden = sites[ATTN_LOGITS], sites[HIDDEN]
            rows.append([r["pair"], arch, fmt(logit.get("first_token"), 2), fmt(logit.get("second_map"), 2),
                         ",".join(map(str, logit.get("layers", []))), fmt(hidden.get("first_token"), 2),
                         ",".join(map(str, hidden.get("layers", [])))])
    header = ["pair", "arm", "logits: key = first token", "logits: Diff map 2", "logits: layers",
              "hidden: first token", "hidden: layers"]
    return render(header, rows)


def seeds_table(summary: list[dict]) -> str:
    rows = []
    for e in summary:
        ratios = []
        for key in ("logit_ratio", "hidden_ratio"):
            v = e[key]
            ratios.append(f"{' / '.join(fmt(x) for x in v['per_seed'])} (geomean {fmt(v['geomean'])}; "
                          f"{v['sign_test']['positive']}/{v['sign_test']['n']} > 1, p {fmt(v['sign_test']['p'])})")
        for i, (scheme, a) in enumerate(e["advantage_4bit"].items()):
            pooled = a["pooled"]
            rows.append([e["preset"], e["budget"], e["other"], " / ".join(map(str, e["seeds"])),
                         *(ratios if i == 0 else ["", ""]), scheme,
                         " / ".join(f"{x:+.3f}" for x in a["per_seed"]),
                         f"{pooled['mean']:+.3f} [{fmt(pooled['low'], 3)}, {fmt(pooled['high'], 3)}]",
                         f"{a['sign_test']['positive']}/{a['sign_test']['n']} (p {fmt(a['sign_test']['p'])})"])
    header = ["size", "budget", "other arm", "seeds", "logit top-1 T/other", "hidden top-1 T/other",
              "4-bit scheme, task", "advantage per seed (Δ ln ppl)", "mean over seeds [95% t]",
              "other lost less (sign test)"]
    return render(header, rows)


def zeroshot_table(verdicts: list[dict]) -> str:
    """One row per pair, task and arm: accuracy, the two chance levels and the permutation p of acc and acc_norm."""
    rows = []
    for v in verdicts:
        by_key = {(t["task"], t["arch"], t["metric"]): t for t in v["tests"]}
        for task, arch in dict.fromkeys((t["task"], t["arch"]) for t in v["tests"]):
            acc, norm = by_key[(task, arch, "acc")], by_key[(task, arch, "acc_norm")]
            rows.append([v["pair"], task, arch, acc["n"], fmt(acc["accuracy"], 3), fmt(acc["uniform_chance"], 3),
                         fmt(acc["shuffled_chance"], 3), f"{acc['p']:.2g}", fmt(norm["accuracy"], 3),
                         f"{norm['p']:.2g}", yes_no(task in v["above_chance"])])
    header = ["pair", "task", "arm", "items", "acc", "chance 1/k", "chance shuffled", "p (acc)", "acc_norm",
              "p (acc_norm)", "every arm above chance"]
    return render(header, rows)


def emergence_table(runs: dict[str, list[dict]]) -> str:
    """Block means of the tracked top-1 (``emergence.block_means``: Transformer vs other) per run, each run ending
    with the relative changes of its last blocks and whether every curve has flattened (``has_flattened``)."""
    rows = []
    for run, blocks in runs.items():
        for b in blocks:
            rows.append([run, f"{tokens_label(b['tokens_from'])}–{tokens_label(b['tokens_to'])}", b["points"],
                         *(fmt(b[site][key], 2 if key == "ratio" else 1) for site in CURVES
                           for key in BLOCK_KEYS)])
        for back, changes in zip(reversed(range(FLAT_BLOCKS)), recent_changes(blocks), strict=True):
            if changes:
                rows.append([run, "last block's change" if back == 0 else f"change {back} block(s) earlier", "",
                             *(f"{changes[f'{site}/{key}']:+.1%}" if f"{site}/{key}" in changes else "—"
                               for site in CURVES for key in BLOCK_KEYS)])
        for what, keys in (("every curve", BLOCK_KEYS), ("the ratios", ("ratio",))):
            if (flat := has_flattened(blocks, keys=keys)) is not None:
                rows.append([run, f"flattened: {what} (|change| < {FLAT_CHANGE:.0%} in the last {FLAT_BLOCKS} "
                             "blocks)", "", yes_no(flat), *[""] * (3 * len(CURVES) - 1)])
    header = ["run", "training tokens", "points", "logit top-1 T", "logit top-1 other", "T/other",
              "hidden top-1 T", "hidden top-1 other", "T/other"]
    return render(header, rows)


def table5_text(table5: dict[str, dict]) -> str:
    parts = []
    for name, recs in table5.items():
        parts += [f"### {name}", "", outlier_table({r["label"]: r for r in recs.values()}, paper=True), ""]
        for arch, rec in recs.items():
            if arch != "transformer":
                ratios = ratio_table(recs["transformer"], rec, other_label=ArchColumn("label")[arch],
                                     paper=arch == "diff")
                parts += [ratios, ""]
    return "\n".join(parts)


def figure8_text(results: list[dict], sweep_path) -> str:
    parts = []
    for r in results:
        parts += [f"### {r['pair']}", "", render_report(read_records(sweep_path(r)), fmt="markdown"), ""]
    return "\n".join(parts)


TREND_SCHEME = f"attn_logits/{SEQUENCE} {GATE_TASK}"  # the 4-bit advantage drawn in trend.png
# the 4-bit advantages trend.md lists: (column, scheme and task prefix of the verdict's advantage_4bit keys)
TREND_ADVANTAGES = (("per sequence, TinyStories", TREND_SCHEME),
                    ("per sequence, books", f"attn_logits/{SEQUENCE} test"),
                    ("per head, TinyStories", f"attn_logits/head {GATE_TASK}"),
                    ("per head and map, TinyStories", f"attn_logits/head_map {GATE_TASK}"))


def trend_runs(results: list[dict], other: str = "diff") -> dict[str, list[dict]]:
    """The cooled pairs with an ``other`` arm per training run, by training tokens. A pair's ``run`` names the run
    its budgets branch from (default: size and seed), so runs at different learning rates or on different data
    are never joined."""
    runs: dict[str, list[dict]] = {}
    for r in sorted(results, key=lambda r: r["tokens"]):
        if r.get("cooled") and other in r["versus"]:
            runs.setdefault(r.get("run", f"{r['preset']}-s{r['seed']}"), []).append(r)
    return runs


def advantage_of(versus: dict, scheme: str) -> dict | None:
    """The 4-bit advantage whose key starts with ``scheme`` (keys end with the task's window count)."""
    return next((a for key, a in versus["advantage_4bit"].items() if key.startswith(scheme)), None)


def trend_table(results: list[dict], other: str = "diff") -> str:
    """trend.png's numbers, one row per cooled budget of each run: whether it passes the gate, the Transformer /
    ``other`` top-1 ratios, both arms' perplexity factor at 4-bit per-sequence logits and ``other``'s 4-bit
    advantages with paired intervals."""
    def interval(a: dict | None) -> str:
        return "—" if a is None else f"{a['advantage']:+.3f} [{a['low']:+.3f}, {a['high']:+.3f}]"

    rows = []
    for run, pairs in trend_runs(results, other).items():
        for r in pairs:
            vs, growth = r["versus"][other], r["ppl_growth_4bit"]
            rows.append([run, tokens_label(r["tokens"]), yes_no(r["gate"]), vs["logit_ratio"],
                         vs["hidden_ratio"],
                         f"{fmt(per_sequence(growth['transformer']))} / {fmt(per_sequence(growth[other]))}",
                         *(interval(advantage_of(vs, scheme)) for _, scheme in TREND_ADVANTAGES)])
    header = ["run", "tokens", "gate", "logit top-1 T/other", "hidden top-1 T/other", "ppl × at 4-bit logits T / other",
              *(f"advantage at 4 bits, {column}" for column, _ in TREND_ADVANTAGES)]
    return render(header, rows)


def plot_verdict_trend(results: list[dict], path: Path, other: str = "diff") -> None:
    """The trend figure of verdict results (:func:`diffquant.plots.plot_trend` draws it from series): Transformer
    / ``other`` ratios and ``other``'s 4-bit advantage against training tokens, cooled pairs only, one line per
    run (:func:`trend_runs`), the pairs below the gate hollow."""
    series = {run: [{"tokens": r["tokens"], "logit_ratio": r["versus"][other]["logit_ratio"],
                     "hidden_ratio": r["versus"][other]["hidden_ratio"],
                     "advantage": advantage_of(r["versus"][other], TREND_SCHEME), "gate": r["gate"]} for r in pairs]
              for run, pairs in trend_runs(results, other).items()}
    if series:
        paper = None if other != "diff" else tuple(
            PAPER_TABLE5[("transformer", kind)][0] / PAPER_TABLE5[("diff", kind)][0] for kind in (ATTN_LOGITS, HIDDEN))
        draw_trend(series, path, paper=paper, scheme=TREND_SCHEME)


plot_trend = plot_verdict_trend  # the old name, kept for callers; plots.plot_trend takes series


# ------------------------------------------------------------------------------------------------ outputs

def sweep_path(out: Path, pair: dict) -> Path:
    """Where a pair's Figure-8 records live under an output folder (``out/table5/PAIR.json`` holds its profile)."""
    return Path(out) / "figure8" / f"{pair['pair']}.jsonl"


def write_outputs(out: Path, results: list[dict], table5: dict[str, dict], note: str = "") -> None:
    """Every verdict file from the records: pairs.json, seeds.json, gate.md (with where the top values sit),
    seeds.md, table5.md, figure8.md (from ``sweep_path``), trend.md and trend.png; ``note`` heads each markdown
    file."""
    out = Path(out)
    summary = over_seeds(results)
    atomic_write_text(out / "pairs.json", json.dumps(results, indent=1))
    atomic_write_text(out / "seeds.json", json.dumps(summary, indent=1))
    atomic_write_text(out / "gate.md", note + gate_table(results) + "\n\n" + sites_table(results) + "\n")
    atomic_write_text(out / "seeds.md", note + seeds_table(summary) + "\n")
    atomic_write_text(out / "table5.md", note + table5_text(table5) + "\n")
    atomic_write_text(out / "figure8.md", note + figure8_text(results, lambda r: sweep_path(out, r)) + "\n")
    atomic_write_text(out / "trend.md", note + trend_table(results) + "\n")
    plot_verdict_trend(results, out / "trend.png")


def write_zeroshot(out: Path, verdicts: list[dict], records_of, note: str = "") -> None:
    """zeroshot.json and zeroshot.md: the chance tests, then Figure 8 on the tasks above chance (``records_of(v)``
    gives a verdict's records)."""
    out = Path(out)
    atomic_write_text(out / "zeroshot.json", json.dumps(verdicts, indent=1))
    parts = [note + zeroshot_table(verdicts), ""]
    for v in verdicts:
        if v["above_chance"]:
            records = [r for r in records_of(v) if r["task"] in v["above_chance"]]
            parts += [f"### {v['pair']}", "", render_report(records, fmt="markdown"), ""]
    atomic_write_text(out / "zeroshot.md", "\n".join(parts) + "\n")


def write_emergence(out: Path, runs: dict[str, list[dict]], note: str = "") -> None:
    """emergence.json and emergence.md: each long run's tracked top-1 in blocks of training tokens."""
    out = Path(out)
    atomic_write_text(out / "emergence.json", json.dumps(runs, indent=1))
    atomic_write_text(out / "emergence.md", note + emergence_table(runs) + "\n")
