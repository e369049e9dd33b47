"""A streamed run's validation loss beside the corpus run of the same preset, rate and seed, step by step: what
cycling a fixed corpus does to held-out loss, arm by arm, while the streamed pair trains (fresh_curves.md)."""

from __future__ import annotations

from ..tables import render
from .cells import fmt
from .pair import ARCH_SHORT, tokens_label


def validation_by_step(log: dict) -> dict[int, tuple[int, float]]:
    """A train log's validation points: step -> (training tokens, loss)."""
    return {v["step"]: (v["tokens"], v["loss"]) for v in log["history"].get("val", [])}


def fresh_curve_rows(run: str, streamed: dict[str, dict], corpus: dict[str, dict]) -> list[list]:
    """One row per arm and validation step both runs reached at the same training tokens: the corpus run's passes
    over its corpus there, both losses and their difference (negative: the fresh stories gave the better model)."""
    rows = []
    for arch in ARCH_SHORT:
        if arch not in streamed or arch not in corpus:
            continue
        fresh, cycled = validation_by_step(streamed[arch]), validation_by_step(corpus[arch])
        corpus_tokens = corpus[arch].get("data", {}).get("corpus_tokens")
        for step in sorted(fresh.keys() & cycled.keys()):
            (tokens, loss), (corpus_at, corpus_loss) = fresh[step], cycled[step]
            if tokens != corpus_at:  # another batch size: not the same point of training
                continue
            passes = fmt(tokens / corpus_tokens) if corpus_tokens else "—"
            rows.append([run, ARCH_SHORT[arch], step, tokens_label(tokens), passes, f"{loss:.3f}",
                         f"{corpus_loss:.3f}", f"{loss - corpus_loss:+.3f}"])
    return rows


def fresh_curves_table(runs: dict[str, tuple[dict[str, dict], dict[str, dict]]]) -> str:
    """fresh_curves.md: for each streamed run, (its arms' train logs, the corpus run's) -> the rows above."""
    rows = [row for run, (streamed, corpus) in runs.items() for row in fresh_curve_rows(run, streamed, corpus)]
    header = ["run", "arm", "step", "training tokens", "corpus passes (corpus run)", "validation, streamed",
              "validation, corpus", "streamed − corpus"]
    return render(header, rows, numparse=False)  # losses keep their three decimals
