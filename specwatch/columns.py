"""Searches over a large read's columns at C speed (catch-up): ranks, counted lines, windows.

The rules' windows (`rules/stats.py`: time-bucket sums) take a read's lines one by one; what is
here only finds which lines a rule must look at. Only the catch-up path of a large read imports
this module (and numpy), so a daemon that only tails a live log does not load it.
"""

from __future__ import annotations

import numpy as np


def unique_first(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(codes, return_index=True)` (the values in order, each one's first index) for
    small non-negative integer codes (ranks, load levels) without sorting them: one comparison
    per code and row."""
    top = int(codes.max()) + 1 if len(codes) else 0
    if not 0 < top <= 64 or codes.dtype.kind not in "iu":
        return np.unique(codes, return_index=True)
    hit = np.arange(top)[:, None] == codes  # (code, row): each code's rows along a contiguous axis
    present = np.flatnonzero(hit.any(1))
    return present, hit[present].argmax(1)


def cached(rows, key, make):
    """`make()`, once per read (`catchup.Rows`): kept with the read's arrays under `key`."""
    found = rows._arrays.get(key)
    if found is None:
        found = rows._arrays[key] = make()
    return found


def by_rank(rows, ordinals: np.ndarray | None = None, key: object = None) -> list[np.ndarray]:
    """Per rank code (`Rows.d_code`: numbered as first seen), its decode ordinals in order:
    all, or those among sorted `ordinals` (cached under `key`)."""
    def make():
        codes = rows.array("d_code")
        n_codes = int(codes.max()) + 1 if len(codes) else 0
        if ordinals is not None:
            codes = codes[ordinals]
        order = np.argsort(codes, kind="stable")
        if ordinals is not None:
            order = ordinals[order]
        return np.split(order, np.cumsum(np.bincount(codes, minlength=n_codes))[:-1]) if n_codes else []
    return cached(rows, ("by_rank", key), make)


def rank_names(rows) -> list[str]:
    """The ranks of a read by code (`Rows.d_code`)."""
    return rows._d_names


def counted(rows, low: float) -> np.ndarray:
    """The decode ordinals whose accept len is valid (`Rows.d_acc` finite) and above `low`."""
    def make():
        acc = rows.array("d_acc")
        return np.flatnonzero((acc > low) & (acc < np.inf))
    return cached(rows, ("counted", low), make)


def window(ordinals: np.ndarray, da: int, db: int) -> np.ndarray:
    """The part of sorted `ordinals` in [da, db)."""
    return ordinals[np.searchsorted(ordinals, da):np.searchsorted(ordinals, db)]


def valid_counts(rows, da: int, db: int) -> dict[str, int]:
    """rank → its decode lines in [da, db) with a valid accept len (`Rows.d_acc_ok`), ranks in
    the order of their first such line (a `Counter` of them)."""
    codes = rows.array("d_code")[da:db][rows.array("d_acc_ok")[da:db]]
    found, first = unique_first(codes)
    counts = np.bincount(codes)
    names = rank_names(rows)
    return {names[c]: int(counts[c]) for c in found[np.argsort(first)].tolist()}


def last_by_rank(rows, da: int, db: int) -> list[tuple[int, int]]:
    """(rank code, its last decode ordinal in [da, db)) of each rank with lines there, ranks in
    the order of their first line there."""
    out = []
    for code, js in enumerate(by_rank(rows)):
        lo, hi = np.searchsorted(js, (da, db))
        if hi > lo:
            out.append((int(js[lo]), code, int(js[hi - 1])))
    return [(code, last) for _, code, last in sorted(out)]
