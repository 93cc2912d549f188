"""`Recent` and `Baseline` (rules/stats.py) fed a whole column of samples at C speed (catch-up).

The results are those of feeding the samples one by one, bit for bit: sums are built with
`numpy.cumsum` over the same additions and subtractions in the same order (an accumulate is a
left-to-right loop of IEEE additions, as Python's `+=` is). numpy is imported here only, and
only the catch-up path of a large read imports this module, so the daemon's idle RSS is unchanged.
"""

from __future__ import annotations

from collections import deque
from itertools import chain, islice

import numpy as np

from specwatch.rules.stats import Baseline, Recent


class Steps:
    """What `Recent.add(t[i], v[i])` did for each new sample i: `sums[i]` and `counts[i]` after
    it, `pruned[i]`: samples pruned before (cumulative, counting the old ones first); `aged`:
    `t`, `v`: old and new samples together; `aged_rows[k]`: the row at which sample k aged out."""

    __slots__ = ("sums", "counts", "pruned", "old", "t", "v", "aged_rows")


def recent_steps(recent: Recent, t: np.ndarray, v: np.ndarray) -> Steps | None:
    """`recent.add` over the new samples (t, v), without changing `recent`; None when the times
    (old and new together) are not in order: then pruning is not a search."""
    old = recent.samples
    n0 = len(old)
    if n0:
        ot = np.fromiter((s[0] for s in old), float, n0)
        ov = np.fromiter((s[1] for s in old), float, n0)
        all_t, all_v = np.concatenate((ot, t)), np.concatenate((ov, v))
    else:
        all_t, all_v = t, v
    if len(all_t) > 1 and not (all_t[1:] >= all_t[:-1]).all():
        return None
    m = len(t)
    # samples pruned by the add of row i: those with time <= t[i] - span, never the new one
    pruned = np.minimum(np.searchsorted(all_t, t - recent.span, side="right"), np.arange(n0, n0 + m))
    pruned = np.maximum.accumulate(pruned) if m else pruned
    before = np.concatenate(([0], pruned[:-1])) if m else pruned
    # the operations on the running sum, in order: + v[i], then - each sample aged at row i
    n_ops = m + int(pruned[-1]) if m else 0
    ops = np.empty(n_ops)
    add_at = np.arange(m) + before
    ops[add_at] = v
    k = np.arange(int(pruned[-1]) if m else 0)
    row_of_k = np.searchsorted(pruned, k, side="right")  # first row whose prune passes k
    ops[row_of_k + 1 + k] = -all_v[k]
    cs = np.cumsum(np.concatenate(([recent.sum], ops)))
    st = Steps()
    st.sums = cs[add_at + 1 + (pruned - before)]
    st.counts = n0 + np.arange(1, m + 1) - pruned
    st.pruned = pruned
    st.old, st.t, st.v = n0, all_t, all_v
    st.aged_rows = row_of_k
    return st


def apply_recent(recent: Recent, steps: Steps, new: list[tuple]) -> None:
    """Make `recent` what the adds of `new` (its samples, as (t, value) tuples) left it."""
    p = int(steps.pruned[-1])
    recent.samples = deque(islice(chain(recent.samples, new), p, None))
    recent._sum = float(steps.sums[-1])


def baseline_steps(base: Baseline, t: np.ndarray, v: np.ndarray) -> tuple | None:
    """`base.add(t[i], v[i])` for each sample in order, without changing `base`: (sums after
    each add, counts after each add, buckets to store) or None when a bucket would be trimmed."""
    m = len(t)
    idx = np.floor(t / base.bucket)
    buckets = base.buckets
    change = np.ones(m, bool)
    if m:
        change[1:] = idx[1:] != idx[:-1]
        change[0] = not buckets or buckets[-1][0] != idx[0]
    starts = np.flatnonzero(change)
    if len(buckets) + len(starts) > base.max_buckets:
        return None  # old buckets would leave the sum: one by one
    sums = np.cumsum(np.concatenate(([base._sum], v)))[1:]
    counts = base.count + np.arange(1, m + 1)
    # each run of one bucket: its sum, added one sample at a time after what the bucket held
    out = []
    bounds = list(starts) + [m]
    if m and not change[0]:
        last = buckets[-1]
        end = int(bounds[0])
        out.append((last, float(np.cumsum(np.concatenate(([last[1]], v[:end])))[-1]), last[2] + end))
    for s, e in zip(bounds, bounds[1:]):
        total = float(np.cumsum(v[s:e])[-1])
        out.append((None, total, int(e - s), int(idx[s])))
    return sums, counts, out


def apply_baseline(base: Baseline, steps: tuple) -> None:
    sums, counts, out = steps
    if not len(sums):
        return
    for entry in out:
        if entry[0] is not None:
            entry[0][1], entry[0][2] = entry[1], entry[2]
        else:
            base.buckets.append([entry[3], entry[1], entry[2]])
    base._sum = float(sums[-1])
    base.count = int(counts[-1])
