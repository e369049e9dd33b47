"""Evaluation against naive one-sequence-at-a-time references, and the statistics against scipy / by hand."""
import json
import math

import numpy as np
import pytest
import scipy.stats
import torch
import torch.nn.functional as F

import diffquant as dq
from diffquant import paired
from diffquant.data import calib_dir
from diffquant.evaluate import (
    encode_pair,
    evaluate_task,
    get_rolling_token_windows,
    make_disjoint_window,
    perplexity_metrics,
    rolling_perplexity,
    rolling_requests,
    score_lambada,
    score_multiple_choice,
    score_requests,
    text_perplexity,
)
from diffquant.paired import (
    binomial_head,
    bootstrap_ppl_ci,
    bootstrap_ppl_ci_plan,
    difference_of_degradations,
    difference_of_degradations_plan,
    discordant_counts,
    mcnemar_exact,
    paired_arrays,
    paired_bootstrap,
    paired_bootstrap_plan,
    paired_bootstrap_ppl,
    paired_bootstrap_ppl_plan,
    resample,
)
from diffquant.tasks import load_task
from diffquant.tokenizer import default_tokenizer

from .conftest import tiny_config
from .helpers import randomize_

FIXTURES = calib_dir() / "eval" / "fixtures"


def _model(max_seq_len, vocab_size=101, arch="diff"):
    """A float64 tiny model with non-trivial weights (float64 so batched and naive sums agree tightly)."""
    return randomize_(dq.build_model(tiny_config(arch, vocab_size=vocab_size, max_seq_len=max_seq_len))).double()


@pytest.fixture(scope="module")
def tok():
    return default_tokenizer()


@pytest.fixture(scope="module")
def lm8k():
    torch.manual_seed(7)
    return _model(256, vocab_size=8192)


@torch.no_grad()
def _nll_next(model, context: list[int], target: int) -> float:
    """-log p(target | context) from one unbatched forward pass."""
    logits = model(torch.tensor([context]))[0, -1]
    return -float(F.log_softmax(logits.double(), -1)[target])


# ------------------------------------------------------------------------------------------------ rolling windows

def test_rolling_windows_match_lm_evals_published_example():
    """lm-eval tests/test_utils.py::test_get_rolling_token_windows_v1 (34 tokens, max 10, context_len 1)."""
    gold = [([-100, *range(0, 9)], list(range(0, 10))), (list(range(9, 19)), list(range(10, 20))),
            (list(range(19, 29)), list(range(20, 30))), (list(range(23, 33)), list(range(30, 34)))]
    assert list(get_rolling_token_windows(list(range(34)), -100, 10, 1)) == gold
    assert make_disjoint_window(gold[3]) == (list(range(23, 30)), list(range(30, 34)))


@pytest.mark.parametrize("n, max_len, stride", [(2, 8, None), (8, 8, None), (9, 8, None), (53, 8, None),
                                                (53, 8, 3), (53, 8, 1), (20, 5, 5), (17, 16, 15)])
def test_every_token_is_scored_exactly_once(n, max_len, stride):
    ids = list(range(100, 100 + n))
    requests = rolling_requests(ids, max_len, stride)
    assert [t for _, cont in requests for t in cont] == ids[1:]  # each once, in order
    end = 1
    for k, (ctx, cont) in enumerate(requests):
        end += len(cont)
        whole = ctx + cont
        assert whole == ids[end - len(whole):end]  # a contiguous stretch ending at the scored tokens
        assert len(whole) - 1 <= max_len  # the model reads at most max_len tokens
        if k > 0:  # later windows read a full max_len (or everything there is)
            assert len(whole) - 1 == min(max_len, end - 1)
            assert len(cont) <= (stride or max_len)


def _lm_eval_context_start(q: int, n: int, max_len: int, stride: int) -> int:
    """Independent formula: the first position lm-eval's window shows when predicting ids[q] (prefix at 0)."""
    if q <= max_len:
        return 0
    window_end = min(max_len + stride * math.ceil((q - max_len) / stride), n - 1)
    return window_end - max_len


@pytest.mark.parametrize("stride, batch_size", [(None, 8), (None, 1), (5, 3), (1, 64)])
def test_rolling_perplexity_equals_a_naive_per_token_loop(stride, batch_size):
    torch.manual_seed(11)
    max_len, n = 16, 61
    model = _model(max_len)
    ids = torch.randint(0, 101, (n,)).tolist()
    out = rolling_perplexity(model, ids, batch_size=batch_size, stride=stride, progress=False)
    s = stride or max_len
    naive = [_nll_next(model, ids[_lm_eval_context_start(q, n, max_len, s):q], ids[q]) for q in range(1, n)]
    assert out["tokens"] == n - 1 == sum(c for _, c in out["window_losses"])
    assert math.isclose(out["loss"] * out["tokens"], math.fsum(naive), rel_tol=1e-9)
    assert math.isclose(out["perplexity"], math.exp(math.fsum(naive) / (n - 1)), rel_tol=1e-9)
    assert out["windows"] == 1 + math.ceil((n - 1 - max_len) / s) and out["max_len"] == max_len
    # per-window sums are the naive per-token losses grouped by window
    sizes = [c for _, c in out["window_losses"]]
    bounds = np.cumsum([0, *sizes])
    for (nll, _), a, b in zip(out["window_losses"], bounds[:-1], bounds[1:], strict=True):
        assert math.isclose(nll, math.fsum(naive[a:b]), rel_tol=1e-9)
    json.dumps(out)


def test_rolling_perplexity_in_float32_and_short_inputs():
    torch.manual_seed(3)
    model = randomize_(dq.build_model(tiny_config("transformer", max_seq_len=16)))
    ids = torch.randint(0, 101, (40,))
    out = rolling_perplexity(model, ids, progress=False)  # a tensor is accepted
    naive = [_nll_next(model, ids[_lm_eval_context_start(q, 40, 16, 16):q].tolist(), int(ids[q]))
             for q in range(1, 40)]
    assert math.isclose(out["loss"], sum(naive) / 39, rel_tol=1e-5)
    two = rolling_perplexity(model, ids[:2], progress=False)
    assert two["tokens"] == 1 and math.isclose(two["loss"], naive[0], rel_tol=1e-5)
    with pytest.raises(ValueError, match="prefix token and at least one"):
        rolling_perplexity(model, ids[:1], progress=False)
    with pytest.raises(ValueError, match="stride must lie in 1..max_len=16"):
        rolling_perplexity(model, ids, stride=17, progress=False)


def test_text_perplexity_scores_each_document_after_bos(tok):
    torch.manual_seed(5)
    model = _model(32, vocab_size=8192)
    docs = ["The cat sat on the mat, and then it slept for a very long time indeed.",
            "", "Dogs bark.\nBirds sing songs in the morning, loudly and without end, every day."]
    out = text_perplexity(model, tok, docs, progress=False)
    per_doc = [rolling_perplexity(model, tok.encode(d, bos=True), progress=False) for d in docs if d]
    nll = sum(r["loss"] * r["tokens"] for r in per_doc)
    assert out["docs"] == 2 and out["tokens"] == sum(r["tokens"] for r in per_doc)
    assert math.isclose(out["loss"] * out["tokens"], nll, rel_tol=1e-9)
    words = sum(len(d.split()) for d in docs if d)
    n_bytes = sum(len(d.encode()) for d in docs if d)
    assert out["words"] == words and out["bytes"] == n_bytes
    assert math.isclose(out["word_perplexity"], math.exp(nll / words), rel_tol=1e-9)
    assert math.isclose(out["bits_per_byte"], nll / n_bytes / math.log(2), rel_tol=1e-9)
    single = text_perplexity(model, tok, docs[0], progress=False)
    assert math.isclose(single["loss"], per_doc[0]["loss"], rel_tol=1e-12)
    with pytest.raises(ValueError, match="every document is empty"):
        text_perplexity(model, tok, ["", ""], progress=False)


def test_limited_perplexity_takes_the_same_windows_as_the_full_one(tok):
    """One tokenizer path for both: all windows through ``limit`` score what ``text_perplexity`` scores, also
    with a transformers-style tokenizer (``bos_token_id``, ``encode(add_special_tokens=...)``)."""

    class HFStyle:  # the attributes a transformers tokenizer shows: encoding adds BOS unless told not to
        bos_token_id, eos_token_id = tok.bos_id, tok.eos_id

        def encode(self, text, add_special_tokens=True):
            return tok.encode(text, bos=add_special_tokens)

    torch.manual_seed(6)
    model = _model(16, vocab_size=8192)
    docs = ["A long tale of a fox who walked far away into the deep wood and never came back home.",
            "Short one.", "The end of the story, told again and again by the old men of the town."]
    for tokenizer in (tok, HFStyle()):
        full = text_perplexity(model, tokenizer, docs, progress=False)
        limited = perplexity_metrics(model, tokenizer, docs, limit=10**6, progress=False)
        assert limited["windows_total"] == limited["windows"] == full["windows"]
        assert limited["window_losses"] == full["window_losses"] and limited["loss"] == full["loss"]


# ------------------------------------------------------------------------------------------------ multiple choice

@torch.no_grad()
def _naive_ll(model, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
    """One sequence, no padding, no batching: sum log p(cont | ctx) and whether cont is the greedy path."""
    logits = model(torch.tensor([(ctx + cont)[:-1]]))[0]
    logp = F.log_softmax(logits.double(), -1)[len(ctx) - 1:]
    target = torch.tensor(cont)
    return float(logp[torch.arange(len(cont)), target].sum()), bool((logp.argmax(-1) == target).all())


@pytest.mark.parametrize("task, fixture", [("hellaswag", "hellaswag_small.jsonl"), ("piqa", "piqa_small.jsonl"),
                                           ("winogrande", "winograd_small.jsonl")])
def test_multiple_choice_equals_a_naive_loop(lm8k, tok, task, fixture):
    items = load_task(task, path=FIXTURES / fixture)
    out = score_multiple_choice(lm8k, tok, items, batch_size=3, progress=False)
    correct, correct_norm = [], []
    for item, rec in zip(items, out["items"], strict=True):
        lls = []
        for context, continuation in item.requests():
            ctx, cont = encode_pair(tok, context, continuation)
            assert ctx[0] == tok.bos_id and tok.decode(cont) == continuation  # exactly the continuation's tokens
            assert ctx[1:] + cont == tok.encode(context + continuation)  # boundary falls between tokens
            lls.append(_naive_ll(lm8k, ctx, cont)[0])
        np.testing.assert_allclose(rec["ll"], lls, rtol=1e-9)
        pred = max(range(len(lls)), key=lambda i: lls[i])
        pred_norm = max(range(len(lls)), key=lambda i: lls[i] / len(item.choices[i]))
        assert (rec["id"], rec["gold"]) == (item.id, item.gold)
        assert (rec["predicted"], rec["predicted_norm"]) == (pred, pred_norm)
        correct.append(pred == item.gold)
        correct_norm.append(pred_norm == item.gold)
        assert (rec["correct"], rec["correct_norm"]) == (correct[-1], correct_norm[-1])
    assert out["n"] == len(items) and out["acc"] == np.mean(correct) and out["acc_norm"] == np.mean(correct_norm)
    json.dumps(out)


def test_lambada_equals_a_naive_loop_with_left_truncation(tok):
    torch.manual_seed(9)
    model = _model(32, vocab_size=8192)  # the fixture contexts are ~100+ tokens: left truncation happens
    items = load_task("lambada", path=FIXTURES / "lambada_small.jsonl")
    out = score_lambada(model, tok, items, batch_size=2, progress=False)
    lls = []
    for item, rec in zip(items, out["items"], strict=True):
        ctx, cont = encode_pair(tok, *item.requests()[0])
        assert len(ctx) + len(cont) > 33
        keep = (ctx + cont)[-33:]
        ll, greedy = _naive_ll(model, keep[:len(keep) - len(cont)], cont)
        assert math.isclose(rec["ll"], ll, rel_tol=1e-9) and rec["correct"] == greedy
        assert rec["tokens"] == len(cont) and rec["id"] == item.id
        lls.append(ll)
    assert math.isclose(out["perplexity"], math.exp(-np.mean(lls)), rel_tol=1e-12)
    assert out["acc"] == np.mean([r["correct"] for r in out["items"]])


def test_greedy_flag_on_a_continuation_the_model_predicts():
    torch.manual_seed(2)
    model = _model(16)
    ctx = torch.randint(0, 101, (5,)).tolist()
    cont = []
    for _ in range(3):  # build the greedy continuation by hand
        cont.append(int(model(torch.tensor([ctx + cont]))[0, -1].argmax()))
    other = [(cont[0] + 1) % 101, *cont[1:]]
    greedy, not_greedy = score_requests(model, [(ctx, cont), (ctx, other)], progress=False)
    assert greedy["greedy"] and not not_greedy["greedy"]


def test_long_continuations_are_scored_in_pieces_like_rolling_windows():
    """A continuation longer than max_len after one BOS is exactly lm-eval's rolling-window scoring."""
    torch.manual_seed(4)
    model = _model(8)
    ids = torch.randint(0, 101, (30,)).tolist()
    (res,) = score_requests(model, [(ids[:1], ids[1:])], progress=False)
    roll = rolling_perplexity(model, ids, progress=False)
    assert res["tokens"] == 29 and math.isclose(-res["ll"], roll["loss"] * roll["tokens"], rel_tol=1e-12)


def test_batching_does_not_change_scores_nor_the_models_mode(lm8k, tok):
    items = load_task("piqa", path=FIXTURES / "piqa_small.jsonl")
    lm8k.train()
    try:
        a = score_multiple_choice(lm8k, tok, items, batch_size=1, progress=False)
        assert lm8k.training
    finally:
        lm8k.eval()
    b = score_multiple_choice(lm8k, tok, items, batch_size=5, progress=False)
    for ra, rb in zip(a["items"], b["items"], strict=True):
        np.testing.assert_allclose(ra["ll"], rb["ll"], rtol=1e-10)
    assert not lm8k.training and all(p.grad is None for p in lm8k.parameters())


def test_quantized_scores_do_not_depend_on_the_batching(lm8k, tok):
    """Per-sequence activation scales see only each row's real tokens, never the padding of a batch.

    float64, so the one difference left, the order of float sums in differently shaped matmuls, stays ~1e-14
    (in float32 the scores come out bit-identical on CPU, but nothing promises that across BLAS builds)."""
    from diffquant.quant import ActQuant, QuantConfig, quantize

    q = quantize(lm8k, QuantConfig(logits=ActQuant(4), qk=ActQuant(6, "head"), hidden=ActQuant(6),
                                   activations=ActQuant(6, "sequence")))
    items = load_task("piqa", path=FIXTURES / "piqa_small.jsonl")
    alone = score_multiple_choice(q, tok, items, batch_size=1, progress=False)["items"]
    padded = score_multiple_choice(q, tok, items, batch_size=5, progress=False)["items"]
    for a, b in zip(alone, padded, strict=True):
        np.testing.assert_allclose(a["ll"], b["ll"], rtol=1e-12)
    docs = [item.contexts[0] + " " + item.choices[0] for item in items]  # short last windows are padded
    one = text_perplexity(q, tok, docs, max_len=32, batch_size=1, progress=False)["window_losses"]
    four = text_perplexity(q, tok, docs, max_len=32, batch_size=4, progress=False)["window_losses"]
    np.testing.assert_allclose(one, four, rtol=1e-12)


def test_evaluate_task_record_and_pairing(lm8k, tok):
    a = evaluate_task(lm8k, tok, "copa", limit=6, seed=1, progress=False)
    assert (a["task"], a["kind"], a["limit"], a["seed"], a["n"]) == ("copa", "multiple_choice", 6, 1, 6)
    b = evaluate_task(lm8k, tok, "COPA", limit=6, seed=1, batch_size=2, progress=False)
    x, y = paired_arrays(a, b)
    assert np.array_equal(x, y) and x.size == 6
    json.dumps(a)
    assert a["subset"] == "first" and [r["id"] for r in a["items"]] == list(range(6))
    c = evaluate_task(lm8k, tok, "copa", limit=6, seed=2, subset="random", progress=False)
    assert c["subset"] == "random"
    with pytest.raises(ValueError, match="do not pair"):
        paired_arrays(a, c)
    with pytest.raises(ValueError, match="unknown task"):
        evaluate_task(lm8k, tok, "nope", progress=False)


def test_bad_requests(lm8k):
    with pytest.raises(ValueError, match="at least one context token"):
        score_requests(lm8k, [([], [1])], progress=False)
    with pytest.raises(ValueError, match="at least one continuation token"):
        score_requests(lm8k, [([1], [])], progress=False)
    with pytest.raises(ValueError, match="no items"):
        score_multiple_choice(lm8k, None, [], progress=False)


# ------------------------------------------------------------------------------------------------ statistics

def _correctness(m, p, rng):
    return (rng.random(m) < p).astype(float)


def test_paired_bootstrap_matches_a_naive_loop_and_scipy():
    rng = np.random.default_rng(0)
    a = _correctness(400, 0.6, rng)
    b = np.where(rng.random(400) < 0.8, a, 1 - a)  # correlated, as a quantized model with its baseline
    out = paired_bootstrap(a, b, n=2000, seed=5)
    assert math.isclose(out["delta"], b.mean() - a.mean()) and out["n_items"] == 400
    naive_rng = np.random.default_rng(5)  # the same draws one resample at a time
    d = b - a
    naive = [d[naive_rng.integers(0, 400, size=400)].mean() for _ in range(2000)]
    np.testing.assert_allclose([out["low"], out["high"]], np.percentile(naive, [2.5, 97.5]), rtol=1e-12)
    ref = scipy.stats.bootstrap((a, b), lambda x, y, axis=-1: y.mean(axis) - x.mean(axis), paired=True,
                                n_resamples=4000, method="percentile", random_state=1).confidence_interval
    assert abs(out["low"] - ref.low) < 0.01 and abs(out["high"] - ref.high) < 0.01
    assert paired_bootstrap(a, b, n=2000, seed=5) == out
    same = paired_bootstrap(a, a, n=100)
    assert same["delta"] == same["low"] == same["high"] == 0.0
    with pytest.raises(ValueError, match="same length"):
        paired_bootstrap(a, b[:-1])
    with pytest.raises(ValueError, match="empty"):
        paired_bootstrap([], [])


@pytest.mark.parametrize("only_a, only_b, both, neither", [(0, 5, 3, 2), (1, 9, 0, 0), (7, 7, 10, 1),
                                                           (40, 61, 500, 300), (0, 0, 4, 4), (1200, 1311, 5, 0)])
def test_mcnemar_matches_scipy_binomtest(only_a, only_b, both, neither):
    a = np.array([1] * only_a + [0] * only_b + [1] * both + [0] * neither)
    b = np.array([0] * only_a + [1] * only_b + [1] * both + [0] * neither)
    perm = np.random.default_rng(0).permutation(a.size)
    a, b = a[perm], b[perm]
    assert discordant_counts(a, b) == (only_a, only_b)
    p = mcnemar_exact(a, b)
    expected = 1.0 if only_a + only_b == 0 else scipy.stats.binomtest(only_b, only_a + only_b, 0.5).pvalue
    assert math.isclose(p, expected, rel_tol=1e-9)


def test_mcnemar_hand_computed_values():
    # 5 discordant, all one way: 2 · (1/2)^5; 10 discordant split 1/9: 2 · (1 + 10) / 2^10
    assert mcnemar_exact([0] * 5, [1] * 5) == 2 / 32
    assert mcnemar_exact([1] + [0] * 9, [0] + [1] * 9) == 2 * 11 / 1024
    assert mcnemar_exact([1, 0, 1], [1, 0, 1]) == 1.0


def test_binomial_head_is_the_exact_sum_of_binomial_coefficients():
    rng = np.random.default_rng(3)
    for n in [0, 1, 2, 7, *rng.integers(8, 3000, 6).tolist()]:
        for k in {0, n // 2, n, *rng.integers(0, n + 1, 2).tolist()}:
            assert binomial_head(n, k) == sum(math.comb(n, i) for i in range(k + 1)), (n, k)


def test_bootstrap_ppl_ci():
    rng = np.random.default_rng(1)
    tokens = rng.integers(50, 65, size=60).astype(float)
    windows = np.stack([tokens * rng.uniform(2.5, 3.5, size=60), tokens], 1).tolist()
    out = bootstrap_ppl_ci(windows, n=3000, seed=2)
    nll, tok = np.array(windows).T
    assert out["perplexity"] == math.exp(nll.sum() / tok.sum()) and out["n_windows"] == 60
    naive_rng = np.random.default_rng(2)
    naive = []
    for _ in range(3000):
        idx = naive_rng.integers(0, 60, size=60)
        naive.append(math.exp(nll[idx].sum() / tok[idx].sum()))
    np.testing.assert_allclose([out["low"], out["high"]], np.percentile(naive, [2.5, 97.5]), rtol=1e-12)
    assert out["low"] < out["perplexity"] < out["high"]
    flat = bootstrap_ppl_ci([[30.0, 10]] * 5, n=50)
    assert math.isclose(flat["low"], math.exp(3)) and math.isclose(flat["high"], math.exp(3))
    with pytest.raises(ValueError, match="window_losses"):
        bootstrap_ppl_ci([])


def test_paired_bootstrap_ppl():
    rng = np.random.default_rng(3)
    tokens = np.full(40, 64.0)
    a = np.stack([tokens * rng.uniform(2.8, 3.2, 40), tokens], 1)
    b = a.copy()
    b[:, 0] += tokens * 0.05  # the quantized model loses 0.05 nats/token everywhere
    out = paired_bootstrap_ppl(a.tolist(), b.tolist(), n=2000)
    assert math.isclose(out["delta"], out["perplexity_b"] - out["perplexity_a"])
    assert math.isclose(out["perplexity_b"] / out["perplexity_a"], math.exp(0.05))
    assert 0 < out["low"] < out["delta"] < out["high"]
    with pytest.raises(ValueError, match="do not pair"):
        paired_bootstrap_ppl(a.tolist(), b[:-1].tolist())


def _plans_over(m: int, rng) -> list:
    """One plan of each statistic over m fresh random units."""
    a, b = _correctness(m, 0.6, rng), _correctness(m, 0.5, rng)
    tokens = rng.integers(20, 70, m).astype(float)
    wa = np.stack([tokens * rng.uniform(2.5, 3.5, m), tokens], 1)
    wb = np.stack([wa[:, 0] + tokens * rng.normal(0.05, 0.02, m), tokens], 1)
    return [paired_bootstrap_plan(a, b), paired_bootstrap_ppl_plan(wa, wb), bootstrap_ppl_ci_plan(wb),
            difference_of_degradations_plan(a, b, b, _correctness(m, 0.5, rng)), paired_bootstrap_plan(a, b)]


@pytest.mark.parametrize("sums_bytes", [paired.SUMS_BYTES, 8 * 700 * 2])  # all columns at once; two at a time
def test_resample_together_equals_each_statistic_alone(monkeypatch, sums_bytes):
    """Plans over the same units share one set of resamples: the same results as each alone (accuracies
    exactly: integer sums; perplexities to rounding: one matrix product over more columns), and as a naive
    loop over the draws in float64."""
    monkeypatch.setattr(paired, "SUMS_BYTES", sums_bytes)
    rng = np.random.default_rng(8)
    plans = [p for m in (37, 500, 37, 1) for p in _plans_over(m, rng)]
    together = resample(plans, 700, seed=4)
    for plan, got in zip(plans, together, strict=True):
        alone = resample([plan], 700, seed=4)[0]
        assert got.keys() == alone.keys() and got["n_boot"] == 700
        if "n_items" in got:
            assert got == alone
        else:
            assert got == pytest.approx(alone, rel=1e-12)
    tok, nll_a, nll_b = plans[6].vectors.T  # m = 500: the paired change of perplexity
    naive_rng, chunk, naive = np.random.default_rng(4), paired.CHUNK_DRAWS // 500, []
    for start in range(0, 700, chunk):  # drawn chunk by chunk, as the resamples are
        for idx in naive_rng.integers(0, 500, size=(min(chunk, 700 - start), 500)):
            t = math.fsum(tok[idx])
            naive.append(math.exp(math.fsum(nll_b[idx]) / t) - math.exp(math.fsum(nll_a[idx]) / t))
    np.testing.assert_allclose([together[6]["low"], together[6]["high"]], np.percentile(naive, [2.5, 97.5]),
                               rtol=1e-9)


def _scipy_interval(data, statistic, n: int, seed: int) -> tuple[float, float]:
    """scipy's paired percentile bootstrap with our generator and chunk size: it draws our resamples."""
    ci = scipy.stats.bootstrap(data, statistic, paired=True, vectorized=True, method="percentile", n_resamples=n,
                               batch=max(1, paired.CHUNK_DRAWS // len(data[0])),
                               rng=np.random.default_rng(seed)).confidence_interval
    return ci.low, ci.high


@pytest.mark.parametrize("m, n", [(400, 3000), (4100, 1200)])  # one chunk of resamples; several
def test_every_interval_is_scipy_bootstrap_on_the_same_resamples(m, n):
    """The same numbers as ``scipy.stats.bootstrap(paired=True, method="percentile")`` (paired.py says why the
    resampling stays ours: a report's hundreds of intervals share one pass), to rounding, on fresh data."""
    rng = np.random.default_rng(m)
    a, b, c, d = (_correctness(m, p, rng) for p in (0.6, 0.5, 0.55, 0.45))
    tokens = rng.integers(20, 70, m).astype(float)
    nll_a = tokens * rng.uniform(2.5, 3.5, m)
    nll_b = nll_a + tokens * rng.normal(0.05, 0.02, m)
    wa, wb = np.stack([nll_a, tokens], 1), np.stack([nll_b, tokens], 1)
    pairs = [
        (paired_bootstrap(a, b, n, seed=3), ((a, b), lambda x, y, axis: y.mean(axis) - x.mean(axis))),
        (difference_of_degradations(a, b, c, d, n, seed=3),
         ((a, b, c, d), lambda w, x, y, z, axis: (z - y).mean(axis) - (x - w).mean(axis))),
        (bootstrap_ppl_ci(wb, n, seed=3), ((nll_b, tokens), lambda x, t, axis: np.exp(x.sum(axis) / t.sum(axis)))),
        (paired_bootstrap_ppl(wa, wb, n, seed=3),
         ((tokens, nll_a, nll_b), lambda t, x, y, axis: np.exp(y.sum(axis) / t.sum(axis)) -
          np.exp(x.sum(axis) / t.sum(axis)))),
    ]
    for ours, (data, statistic) in pairs:
        np.testing.assert_allclose([ours["low"], ours["high"]], _scipy_interval(data, statistic, n, 3),
                                   rtol=1e-9, atol=1e-15)


def test_difference_of_degradations():
    rng = np.random.default_rng(4)
    m = 300
    base_a = _correctness(m, 0.6, rng)
    quant_a = base_a * (rng.random(m) < 0.7)  # a loses ~30% of its correct items
    base_b = _correctness(m, 0.65, rng)
    quant_b = base_b * (rng.random(m) < 0.95)
    out = difference_of_degradations(base_a, quant_a, base_b, quant_b, n=2000, seed=3)
    assert math.isclose(out["delta_a"], quant_a.mean() - base_a.mean())
    assert math.isclose(out["delta_b"], quant_b.mean() - base_b.mean())
    assert math.isclose(out["difference"], out["delta_b"] - out["delta_a"])
    assert out["low"] < out["difference"] < out["high"] and out["low"] > 0  # b clearly degrades less
    # with no change in a, it is the paired bootstrap of b alone (same items resampled the same way)
    solo = difference_of_degradations(base_a, base_a, base_b, quant_b, n=2000, seed=3)
    ref = paired_bootstrap(base_b, quant_b, n=2000, seed=3)
    assert (solo["difference"], solo["low"], solo["high"]) == pytest.approx((ref["delta"], ref["low"], ref["high"]))
    with pytest.raises(ValueError, match="same length"):
        difference_of_degradations(base_a, quant_a, base_b, quant_b[:-1])
