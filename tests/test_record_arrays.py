"""Records read as arrays (diffquant.record_arrays): the same items back, the same report, every column kind."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from diffquant.paired import paired_arrays
from diffquant.record_arrays import ItemColumns, compact_units, same_values
from diffquant.records import load_records, read_records
from diffquant.report import render_report

FIXTURE = Path(__file__).parent / "fixtures" / "records.jsonl"


def _random_items(rng, n: int) -> list[dict]:
    ll = rng.normal(-40, 9, (n, 4))
    return [{"id": int(i), "gold": int(rng.integers(4)), "predicted": int(ll[k].argmax()),
             "correct": bool(rng.random() < .4), "ll": ll[k, : rng.integers(2, 5)].tolist(),
             "tokens": int(rng.integers(1, 9))}
            for k, i in enumerate(rng.permutation(3 * n)[:n])]


def test_items_come_back_exactly():
    rng = np.random.default_rng(11)
    items = _random_items(rng, 257)
    cols = ItemColumns.from_items(copy.deepcopy(items))
    assert isinstance(cols, ItemColumns) and len(cols) == 257
    assert list(cols) == items and cols[-1] == items[-1] and cols[3:9:2] == items[3:9:2]
    assert json.dumps(list(cols)) == json.dumps(items)  # same Python types: ints stay ints, bools bools
    assert cols.column("correct").dtype == np.bool_ and cols.column("ll") is None  # ragged: read item by item
    with pytest.raises(IndexError):
        cols[257]


@pytest.mark.parametrize("change", [
    lambda items: items[5].pop("tokens"),                    # a key missing
    lambda items: items[5].update(extra=1),                  # a key more
    lambda items: (items[5].pop("tokens"), items[5].update(other=1)),  # the same count, another key
])
def test_items_without_the_same_keys_stay_a_list(change):
    items = _random_items(np.random.default_rng(1), 20)
    change(items)
    assert ItemColumns.from_items(items) is items
    assert ItemColumns.from_items([]) == [] and ItemColumns.from_items([1, 2]) == [1, 2]


def test_columns_of_mixed_or_huge_values_stay_python_values():
    items = [{"id": 1, "ll": 0.5, "x": 2**70}, {"id": 2, "ll": 1, "x": 3}, {"id": 3, "ll": -2.0, "x": 4}]
    cols = ItemColumns.from_items(copy.deepcopy(items))
    assert cols.column("ll") is None and cols.column("x") is None and cols.column("id").dtype == np.int64
    assert json.dumps(list(cols)) == json.dumps(items)


def test_paired_arrays_of_columns_equal_those_of_lists():
    rng = np.random.default_rng(5)
    a, b = _random_items(rng, 300), _random_items(rng, 300)
    ids = [it["id"] for it in a]
    for it, i in zip(b, rng.permutation(ids), strict=True):  # the same ids in another order
        it["id"] = int(i)
    lists = paired_arrays({"items": a}, {"items": b}, "correct")
    cols = paired_arrays({"items": ItemColumns.from_items(a)}, {"items": ItemColumns.from_items(b)}, "correct")
    assert all(np.array_equal(x, y) for x, y in zip(lists, cols, strict=True))
    b[0]["id"] = 10**6
    with pytest.raises(ValueError, match="2 item ids differ"):
        paired_arrays({"items": ItemColumns.from_items(a)}, {"items": ItemColumns.from_items(b)}, "correct")
    with pytest.raises(ValueError, match="2 item ids differ"):
        paired_arrays({"items": a}, {"items": b}, "correct")


def test_repeated_ids_are_read_as_lists_read_them():
    """Repeated ids: the last item of an id wins, as in the dict the list is read into."""
    items = [{"id": 1, "correct": True}, {"id": 2, "correct": False}, {"id": 1, "correct": False}]
    other = [{"id": 2, "correct": True}, {"id": 1, "correct": True}]
    expected = paired_arrays({"items": items}, {"items": other})
    got = paired_arrays({"items": ItemColumns.from_items(items)}, {"items": ItemColumns.from_items(other)})
    assert all(np.array_equal(x, y) for x, y in zip(expected, got, strict=True))


def test_compact_units_of_every_record_kind():
    for rec in read_records(FIXTURE):
        before = copy.deepcopy(rec)
        m = compact_units(rec)["metrics"]
        if "items" in m:
            assert isinstance(m["items"], ItemColumns) and list(m["items"]) == before["metrics"]["items"]
        else:
            assert m["window_losses"].dtype == np.float64 and m["window_losses"].shape == (m["windows"], 2)
            assert np.array_equal(m["window_losses"], np.array(before["metrics"]["window_losses"], float))
            assert same_values(m["window_ids"], before["metrics"]["window_ids"])
    assert same_values(None, None) and not same_values(None, [1]) and not same_values([1, 2], [2, 1])


def _lambada_with_repeats(records: list[dict]) -> list[dict]:
    """The fixture with a LAMBADA item id repeated in every record (sorting must keep the order they have)."""
    out = copy.deepcopy(records)
    for rec in out:
        if rec["kind"] == "lambada":
            items = rec["metrics"]["items"]
            items.append({**items[0], "ll": items[0]["ll"] - 1.5})
    return out


@pytest.mark.parametrize("fmt", ["markdown", "csv"])
def test_the_report_of_compact_records_is_identical(tmp_path, fmt):
    file = tmp_path / "records.jsonl"
    file.write_text("".join(json.dumps(r) + "\n" for r in _lambada_with_repeats(read_records(FIXTURE))))
    plain, compact = load_records([file]), load_records([file], compact=True)
    assert isinstance(compact[0]["metrics"]["window_losses"], np.ndarray)
    assert render_report(compact, fmt, n_boot=400, seed=3) == render_report(plain, fmt, n_boot=400, seed=3)
