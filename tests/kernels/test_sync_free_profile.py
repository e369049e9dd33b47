"""tests/test_profile.py rerun with the sync-free statistics, plus the two paths side by side."""

import importlib

import pytest
import torch

from diffquant.profile import profile

from ..test_profile import (  # noqa: F401  (pytest collects the imported tests and fixture here)
    batches,
    model,  # noqa: F811
    test_bad_arguments,
    test_chunked_profile_equals_unchunked,
    test_global_topk_and_median_equal_torch_over_everything,
    test_hooks_removed_and_impl_restored_on_error,
    test_masked_logits_never_count,
    test_per_layer_results_and_nonfinite_counts,
    test_profiling_leaves_outputs_and_settings_unchanged,
    test_report_json_round_trip_and_tables,
    test_top_locations_point_at_the_values,
)

profile_module = importlib.import_module("diffquant.profile")  # dq.profile is the function
SYNC_CALLS = ("item", "cpu", "tolist", "__float__", "__int__", "__bool__", "numpy")


@pytest.fixture(autouse=True)
def sync_free_default(monkeypatch):
    monkeypatch.setattr(profile_module, "SYNC_FREE_ON_CPU", True)


def without_means(data):
    if isinstance(data, dict):
        return {k: without_means(v) for k, v in data.items() if k != "mean_abs"}
    if isinstance(data, list):
        return [without_means(v) for v in data]
    return data


def test_sync_free_report_equals_the_host_report(model):  # noqa: F811
    data = batches(T=20)
    a = profile(model, data, topk=40, chunk=6, sync_free=True, progress=False).data
    b = profile(model, data, topk=40, chunk=6, sync_free=False, progress=False).data
    assert without_means(a) == without_means(b)
    for kind in ("attn_logits", "hidden"):
        assert a["sites"][kind]["mean_abs"] == pytest.approx(b["sites"][kind]["mean_abs"], rel=1e-6)


def test_probe_calls_never_sync_after_the_first_batch(model, monkeypatch):  # noqa: F811
    """Every sync entry point is counted inside the probe hooks; the first batch may find the mask positions."""
    data = batches()
    hits, batch = [], [0]
    original_hook, original_run = profile_module._Profiler.hook, profile_module._Profiler.run_batch

    def counting_run(self, model, ids):
        original_run(self, model, ids)
        batch[0] += 1

    def counting_hook(self, *args):
        saved = {n: getattr(torch.Tensor, n) for n in SYNC_CALLS}
        if batch[0] > 0:
            for n, f in saved.items():
                setattr(torch.Tensor, n, lambda t, *a, _n=n, _f=f, **kw: (hits.append(_n), _f(t, *a, **kw))[1])
        try:
            return original_hook(self, *args)
        finally:
            for n, f in saved.items():
                setattr(torch.Tensor, n, f)

    monkeypatch.setattr(profile_module._Profiler, "hook", counting_hook)
    monkeypatch.setattr(profile_module._Profiler, "run_batch", counting_run)
    report = profile(model, data, topk=20, progress=False)
    assert batch[0] == len(data) and report.sites["attn_logits"]["count"] > 0
    assert hits == []
