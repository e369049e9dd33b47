"""A sweep record's per-unit lists held as numpy arrays (pure: numpy only), for reading large records files.

Parsed JSON holds a dict per item (~700 bytes for a multiple-choice item) and a list per perplexity window: a
140 MB records file becomes ~1 GB of Python objects. :func:`compact_units` replaces a record's ``items`` with an
:class:`ItemColumns` (one array per key; indexing and iteration give the item dicts back, so code written for the
list reads it unchanged) and its ``window_losses`` / ``window_ids`` with arrays, ~40× smaller.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

# Python type of every value of a column -> the array dtype that gives the same values back
SCALAR_DTYPES = {bool: np.bool_, int: np.int64, float: np.float64}


class ItemColumns(Sequence):
    """Items (dicts with the same keys in the same order) as columns: scalar columns as arrays, lists of floats
    (a multiple-choice item's ``ll``) as one flat array with offsets, anything else as the list it was."""

    def __init__(self, keys: tuple[str, ...], size: int, columns: dict):
        self.keys, self.size, self._columns = keys, size, columns

    @classmethod
    def from_items(cls, items: list[dict]) -> ItemColumns | list[dict]:
        """``items`` as columns, or ``items`` itself when they do not all have the same keys (or none)."""
        if not items or set(map(type, items)) != {dict}:
            return items
        keys = tuple(items[0])
        if set(map(len, items)) != {len(keys)}:
            return items
        try:  # the same number of keys and each of the first item's: the same keys
            return cls(keys, len(items), {k: _column([it[k] for it in items]) for k in keys})
        except KeyError:
            return items

    def column(self, key: str) -> np.ndarray | None:
        """The values of ``key`` as one array (None when they are not scalars of one type)."""
        col = self._columns[key]
        return col if isinstance(col, np.ndarray) else None

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.size))]
        if not -self.size <= i < self.size:
            raise IndexError(i)
        i %= self.size
        return {k: _value(self._columns[k], i) for k in self.keys}

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(self.size))


class _Ragged:
    """Lists of floats of varying length: one flat array and where each list starts."""

    def __init__(self, flat: list[float], lengths: list[int]):
        self.flat = np.array(flat, dtype=np.float64)
        self.starts = np.cumsum([0, *lengths])

    def row(self, i: int) -> list[float]:
        return self.flat[self.starts[i]:self.starts[i + 1]].tolist()


def _column(values: list):
    types = set(map(type, values))
    kind = types.pop() if len(types) == 1 else None
    if kind in SCALAR_DTYPES:
        try:
            return np.array(values, dtype=SCALAR_DTYPES[kind])
        except OverflowError:  # integers beyond int64 stay Python integers
            return values
    if kind is list:
        flat = [x for row in values for x in row]
        if set(map(type, flat)) <= {float}:
            return _Ragged(flat, list(map(len, values)))
    return values


def _value(col, i: int):
    if isinstance(col, np.ndarray):
        return col[i].item()
    if isinstance(col, _Ragged):
        return col.row(i)
    return col[i]


def compact_units(rec: dict) -> dict:
    """``rec`` (a validated record) with its items as :class:`ItemColumns` and its window losses (null nats as
    NaN, as the statistics read them) and window ids as arrays; changed in place and returned."""
    m = rec["metrics"]
    if isinstance(m.get("items"), list):
        m["items"] = ItemColumns.from_items(m["items"])
    if isinstance(m.get("window_losses"), list):
        m["window_losses"] = np.array(m["window_losses"], dtype=np.float64).reshape(-1, 2)
    ids = m.get("window_ids")
    if isinstance(ids, list) and all(type(i) is int for i in ids):
        m["window_ids"] = np.array(ids, dtype=np.int64)
    return rec


def same_values(a, b) -> bool:
    """Two unit lists or arrays (or None) hold the same values in the same order."""
    if a is None or b is None:
        return a is b
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def column_by_id(items: Sequence[dict], key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids, values of ``key``) of :class:`ItemColumns` with unique ids; None for anything else (a plain list,
    repeated ids, non-scalar values), which the caller reads item by item."""
    if not isinstance(items, ItemColumns):
        return None
    ids, values = items.column("id"), items.column(key)
    if ids is None or values is None or np.unique(ids).size != ids.size:
        return None
    return ids, values
