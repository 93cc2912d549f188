"""`Recent` and `Baseline` (`rules/stats.py`) fed a whole column of samples at C speed (catch-up).

The results are those of feeding the samples one by one, bit for bit: sums are built with
`numpy.cumsum` over the same additions and subtractions in the same order (an accumulate is a
left-to-right loop of IEEE additions, as Python's `+=` is), starting again from 0.0 where a
prune empties the window, as `Recent.prune` does. Only the catch-up path of a large read
imports this module (and numpy), so a daemon that only tails a live log does not load it.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from itertools import chain, islice
from operator import itemgetter

import numpy as np

from specwatch.rules.stats import Baseline, Pairs, Recent


_time = itemgetter(0)


class Steps:
    """What `Recent.add(t[i], v[i])` did for each new sample i: `sums[i]` and `counts[i]` after
    it, `pruned[i]`: samples pruned before (cumulative, counting the old ones first); `aged`:
    `t`, `v`: old and new samples together; `aged_rows[k]`: the row at which sample k aged out."""

    __slots__ = ("sums", "counts", "pruned", "old", "t", "v", "aged_rows", "twin_sums")


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


def _first(samples, k: int) -> np.ndarray:
    """A window's first k samples (`Recent.samples`: Pairs or a deque) as a (k, 2) array (t, value)."""
    out = np.empty((k, 2))
    if not k:
        return out
    if type(samples) is Pairs:
        h = samples.head
        out[:, 0] = np.frombuffer(samples.t[h:h + k], float)
        out[:, 1] = np.frombuffer(samples.v[h:h + k], float)
        return out
    return np.fromiter(chain.from_iterable(islice(samples, k)), float, 2 * k).reshape(k, 2)


def recent_steps(recent: Recent, rows_t: np.ndarray, v: np.ndarray, at: np.ndarray | None = None,
                 twin: Recent | None = None, twin_v: np.ndarray | None = None) -> Steps | None:
    """`recent` over rows at times `rows_t`: at row `at[i]` (every row when None) `add(t, v[i])`,
    at the others `prune(t)`; without changing `recent`. Arrays are per row. None when the
    times (old samples and rows together) are not in order: then pruning is not a search.
    `twin`: a window of the same samples' times (degradation's running requests) fed `twin_v`:
    its sums too (`twin_sums`), None when its samples' times are not those of `recent`."""
    m = len(rows_t)
    if at is None:
        at = np.arange(m)
    if m > 1 and not (rows_t[1:] >= rows_t[:-1]).all():
        return None
    t = rows_t[at]
    old = recent.samples
    n0 = len(old)
    # only the old samples at the front that may age out by the last row are read: found by
    # bisection, then checked (in order, at or before the limit, the next one after it)
    limit = float(rows_t[-1]) - recent.span if m else -np.inf
    nf = bisect_right(old, limit, key=_time)
    front = _first(old, nf)
    ft, fv = front[:, 0], front[:, 1]
    if nf and (ft[-1] > limit or nf > 1 and not (ft[1:] >= ft[:-1]).all()) or nf < n0 and old[nf][0] <= limit:
        return None
    added = np.searchsorted(at, np.arange(m), side="right")  # new samples added by the end of each row
    if nf < n0:  # an old sample stays: the front stops there, no new sample ages out
        all_t, all_v, cap = ft, fv, nf
    else:
        if nf and len(t) and ft[-1] > t[0]:
            return None
        all_t, all_v, cap = np.concatenate((ft, t)), np.concatenate((fv, v)), n0 + added
    # samples pruned by the end of each row: those with time <= t - span (never one not added yet)
    pruned = np.minimum(np.searchsorted(all_t, rows_t - recent.span, side="right"), cap)
    total = int(pruned[-1]) if m else 0
    # the operations on the running sum, in order: + v[i] at its row, then - each sample aged there
    ops = np.empty(len(at) + total)
    prev_added = np.concatenate(([0], added[:-1]))
    prev_pruned = np.concatenate(([0], pruned[:-1]))
    ops[(prev_added + prev_pruned)[at]] = v
    k = np.arange(total)
    aged_rows = np.searchsorted(pruned, k, side="right")  # first row whose prune passes sample k
    ops[added[aged_rows] + k] = -all_v[k]
    ends, counts = added + pruned, n0 + added - pruned
    empties = np.flatnonzero(counts == 0).tolist()
    st = Steps()
    st.sums = _running(ops, recent.sum, empties, ends)
    st.counts = counts
    st.pruned = pruned
    st.old, st.t, st.v = n0, all_t, all_v
    st.aged_rows = aged_rows
    st.twin_sums = None
    if twin is not None and len(twin.samples) == n0 and twin.span == recent.span and \
            (nf == n0 or twin.samples[nf][0] == old[nf][0]):
        pair = _first(twin.samples, nf)
        if (pair[:, 0] == ft).all():
            ops[(prev_added + prev_pruned)[at]] = twin_v
            ops[added[aged_rows] + k] = -(pair[:, 1] if nf < n0 else np.concatenate((pair[:, 1], twin_v)))[k]
            st.twin_sums = _running(ops, twin.sum, empties, ends)
    return st


def _running(ops: np.ndarray, start_sum: float, empties: list[int], ends: np.ndarray) -> np.ndarray:
    """The running sum after each row (`ends[r]`: operations done by then), added one operation
    at a time; a prune that empties the window (rows `empties`) sets it to 0.0 exactly and the
    sum starts again there, as `Recent.prune` does."""
    cs = np.empty(len(ops) + 1)
    cs[0] = start_sum
    start = 0
    for z in empties:
        end = int(ends[z])
        if end > start:
            cs[start + 1:end + 1] = np.cumsum(np.concatenate(([start_sum], ops[start:end])))[1:]
        cs[end], start_sum, start = 0.0, 0.0, end
    if start < len(ops):
        cs[start + 1:] = np.cumsum(np.concatenate(([start_sum], ops[start:])))[1:]
    return cs[ends]


def apply_recent(recent: Recent, steps: Steps, ordinals: np.ndarray, times: np.ndarray, values: np.ndarray) -> None:
    """Make `recent` what its adds left it: the new samples are (times[j], values[j]) of the
    decode ordinals j in `ordinals` (columns of the read; an int array gives ints), made only
    for those that stay, as Python numbers."""
    if len(steps.pruned):
        set_recent(recent, int(steps.pruned[-1]), float(steps.sums[-1]), ordinals, times, values)


def set_recent(recent: Recent, pruned: int, total: float, ordinals: np.ndarray, times: np.ndarray,
               values: np.ndarray) -> None:
    """`recent` less its first `pruned` samples (old, then new), plus the new samples left, and
    its sum `total` (`apply_recent`)."""
    old = recent.samples
    tail = ordinals[max(0, pruned - len(old)):]
    if type(old) is Pairs:
        h = old.head + min(pruned, len(old))
        t, v = old.t[h:], old.v[h:]
    else:  # a window saved by an earlier version, or restored as a list
        flat = array("d", chain.from_iterable(islice(old, pruned, None)))
        t, v = flat[0::2], flat[1::2]
    t.frombytes(times[tail].astype(float).tobytes())
    v.frombytes(values[tail].astype(float).tobytes())
    p = Pairs()
    p.t, p.v = t, v
    recent.samples = p  # the compact store the per-line path keeps
    recent._sum = total


class LevelSteps:
    """What `levels_steps` found for L windows over m rows: `sums[l, r]`, `counts[l, r]`,
    `pruned[l, r]` (samples aged out so far) after row r; per level the samples that aged out,
    in order (`aged_t`, `aged_v`) and the row each aged at (`aged_rows`)."""

    __slots__ = ("sums", "counts", "pruned", "aged_t", "aged_v", "aged_rows")


def levels_steps(recents: list[Recent], t: np.ndarray, v: np.ndarray, li: np.ndarray) -> LevelSteps | None:
    """One rank's rows at times `t`, in one pass: at row r `recents[li[r]].add(t[r], v[r])`,
    then every other window pruned at t[r] (`ThroughputDropRule._observe`), without changing
    them. None when the times (each window's old samples, then the rows) are not in order.
    Each window's sum is rebuilt from its additions and subtractions in order, from 0.0 again
    where a prune empties it, as `Recent` does."""
    m, n_lv = len(t), len(recents)
    span = recents[0].span if recents else 0.0
    if not m or m > 1 and not (t[1:] >= t[:-1]).all() or any(r.span != span for r in recents):
        return None
    q = t - span  # a sample at time x ages out at the first row with x <= q
    limit = float(q[-1])
    n0 = np.array([len(r.samples) for r in recents])
    nf = np.array([bisect_right(r.samples, limit, key=_time) for r in recents])
    if any(k < len(r.samples) and r.samples[k][0] <= limit for r, k in zip(recents, nf.tolist())):
        return None
    n_front = int(nf.sum())
    front = np.concatenate([_first(r.samples, k) for r, k in zip(recents, nf.tolist())] + [np.empty((0, 2))])
    ft, fv = front[:, 0], front[:, 1]
    fl = np.repeat(np.arange(n_lv), nf)
    if n_front and ((ft > limit).any() or not ((ft[1:] >= ft[:-1]) | (fl[1:] != fl[:-1])).all()):
        return None
    whole = nf == n0  # windows whose old samples all age out: then their new ones may, after them
    present, first = unique_first(li)
    ends = np.cumsum(nf)
    last = whole[present] & (nf[present] > 0)
    if (ft[ends[present[last]] - 1] > t[first[last]]).any():
        return None
    new_aged = np.where(whole[li], np.searchsorted(q, t, "left"), m)  # m: not in this read
    sel = np.flatnonzero(new_aged < m)
    n_pr = n_front + len(sel)
    # every add and prune: by window, row, adds before prunes, prunes oldest first
    lvl = np.concatenate((li, fl, li[sel]))
    row = np.concatenate((np.arange(m), np.searchsorted(q, ft, "left"), new_aged[sel]))
    phase = np.concatenate((np.zeros(m, np.int8), np.ones(n_pr, np.int8)))
    seq = np.concatenate((np.arange(m), np.arange(n_front), n_front + sel))
    order = np.argsort(((lvl * (m + 1) + row) * 2 + phase) * (n_front + 2 * m) + seq, kind="stable")
    lvl, row, prune = lvl[order], row[order], phase[order] == 1
    val = np.concatenate((v, -fv, -v[sel]))[order]
    when = np.concatenate((t, ft, t[sel]))[order]
    bounds = np.searchsorted(lvl, np.arange(n_lv + 1))
    cd = np.concatenate(([0], np.cumsum(np.where(prune, -1, 1))))
    counts = n0[lvl] + cd[1:] - cd[bounds[lvl]]
    cs = np.empty(len(val))
    restarts = np.flatnonzero(counts == 0)  # a prune that empties a window: its sum is 0.0 again
    for x in range(n_lv):
        start, end, total = int(bounds[x]), int(bounds[x + 1]), recents[x].sum
        for z in restarts[(restarts >= start) & (restarts < end)].tolist() + [end - 1]:
            if z >= start:
                cs[start:z + 1] = np.cumsum(np.concatenate(([total], val[start:z + 1])))[1:]
                if counts[z] == 0:
                    cs[z], total = 0.0, 0.0
            start = z + 1
    # each window after each row: its last event at or before the row, else as it was
    key = lvl * (m + 1) + row
    last = np.flatnonzero(np.append(key[1:] != key[:-1], True))  # each window's last event of a row
    at = np.full((n_lv, m), -1)
    at[lvl[last], row[last]] = last
    at = np.maximum.accumulate(at, axis=1)
    seen = at >= 0
    pe = np.concatenate(([0], np.cumsum(prune)))
    s = LevelSteps()
    s.sums = np.where(seen, cs[at], np.array([r.sum for r in recents])[:, None])
    s.counts = np.where(seen, counts[at], n0[:, None])
    s.pruned = np.where(seen, pe[at + 1] - pe[bounds[:-1]][:, None], 0)
    aged = np.flatnonzero(prune)
    cut = np.searchsorted(aged, bounds)
    s.aged_t = [when[aged[cut[x]:cut[x + 1]]] for x in range(n_lv)]
    s.aged_v = [-val[aged[cut[x]:cut[x + 1]]] for x in range(n_lv)]
    s.aged_rows = [row[aged[cut[x]:cut[x + 1]]] for x in range(n_lv)]
    return s


def baseline_steps(base: Baseline, t: np.ndarray, v: np.ndarray) -> tuple:
    """`base.add(t[i], v[i])` for each sample in order, without changing `base`: (sums after
    each add, counts after each add, buckets to store, buckets to drop). A new bucket past
    `max_buckets` drops the oldest (`Baseline._trim`): its final sum and count leave the totals
    right after the add that made the new one, as they do one by one."""
    m = len(t)
    idx = np.floor(t / base.bucket)
    buckets = base.buckets
    n_old = len(buckets)
    change = np.ones(m, bool)
    if m:
        change[1:] = idx[1:] != idx[:-1]
        change[0] = not buckets or buckets[-1][0] != idx[0]
    starts = np.flatnonzero(change)
    bounds = starts.tolist() + [m]
    # each bucket's final (sum, count): the last old one grown by the samples before the first
    # new bucket, then each run of one bucket, added one sample at a time
    out = []
    if m and not change[0]:
        last = buckets[-1]
        end = bounds[0]
        out.append((last, float(np.cumsum(np.concatenate(([last[1]], v[:end])))[-1]), last[2] + end))
    for s, e in zip(bounds, bounds[1:]):
        out.append((None, float(np.cumsum(v[s:e])[-1]), e - s, int(idx[s])))
    # the k-th new bucket (global index n_old + k) drops bucket n_old + k - max_buckets, if any
    drop_at = starts[max(0, base.max_buckets - n_old):]  # samples whose add drops a bucket
    if not len(drop_at):
        return np.cumsum(np.concatenate(([base._sum], v)))[1:], base.count + np.arange(1, m + 1), out, 0
    final = [(b[1], b[2]) for b in islice(buckets, min(len(drop_at), n_old))]
    if out and out[0][0] is not None and len(final) == n_old:
        final[-1] = out[0][1:]
    final += [o[1:3] for o in out if o[0] is None][:len(drop_at) - len(final)]
    ops = np.empty(m + len(drop_at))
    before = np.searchsorted(drop_at, np.arange(m), side="left")  # drops before sample i
    ops[np.arange(m) + before] = v
    ops[drop_at + np.arange(1, len(drop_at) + 1)] = [-s for s, _ in final]
    cs = np.cumsum(np.concatenate(([base._sum], ops)))
    upto = np.searchsorted(drop_at, np.arange(m), side="right")  # drops up to sample i's add
    sums = cs[np.arange(1, m + 1) + upto]
    lost = np.concatenate(([0], np.cumsum([n for _, n in final], dtype=np.int64)))
    counts = base.count + np.arange(1, m + 1) - lost[upto]
    return sums, counts, out, len(drop_at)


def apply_baseline(base: Baseline, steps: tuple) -> None:
    sums, counts, out, drops = steps
    if not len(sums):
        return
    for entry in out:
        if entry[0] is not None:
            entry[0][1], entry[0][2] = entry[1], entry[2]
        else:
            base.buckets.append([entry[3], entry[1], entry[2]])
    for _ in range(drops):
        base.buckets.popleft()
    base._sum = float(sums[-1])
    base.count = int(counts[-1])


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
