"""rules/stats.Recent: the window of the last `span` seconds as time-bucket sums, its running
sum, its bounded size and its saved form."""

from __future__ import annotations

import math
import random
import tracemalloc
from collections import deque

import pytest

from specwatch.rules.stats import MAX_BUCKETS, Baseline, Recent, bucket_width


def test_window_on_whole_second_stamps_holds_exactly_the_samples_of_the_span():
    """Against the window of samples written out plainly (a deque), over random whole-second
    times, gaps, bursts of lines in one second and values: the same count and sum, and the
    samples that age out come back as their seconds' (start, sum, count)."""
    rng = random.Random(7)
    for span in (5.0, 30.0, 600.0):
        r, ref, t = Recent(span), deque(), 1.7e9
        for _ in range(3000):
            t += rng.choice([0, 0, 0, 1, 1, 3, 50, 700])
            v = rng.random() * 5 if rng.random() < 0.9 else rng.randint(0, 100)
            add = rng.random() > 0.05  # else only a prune
            if add:
                ref.append((t, v))
            aged = []
            while ref and ref[0][0] <= t - span:
                aged.append(ref.popleft())
            got = r.add(t, v) if add else r.prune(t)
            by_second: dict[float, list[float]] = {}
            for at, x in aged:
                by_second.setdefault(at, []).append(x)
            assert [(a, n) for a, _, n in got] == [(a, len(xs)) for a, xs in by_second.items()]
            assert [s for _, s, _ in got] == pytest.approx([sum(xs) for xs in by_second.values()])
            assert len(r) == len(ref)
            assert r.sum == pytest.approx(sum(x for _, x in ref), abs=1e-9)
            if not ref:
                assert r.sum == 0.0 and r.mean() is None


def test_finer_stamps_age_at_most_one_bucket_early():
    rng = random.Random(3)
    r, t, kept = Recent(60.0), 1000.0, deque()
    for _ in range(5000):
        t += rng.random() * 0.4
        r.add(t, 1.0)
        kept.append(t)
        while kept and kept[0] <= t - 60.0:
            kept.popleft()
        inside = sum(1 for x in kept if x > t - 60.0 + r.width)
        assert inside <= len(r) <= len(kept)


def test_bucket_count_is_bounded_by_the_span_not_the_rate():
    """A 600 s window at 200 lines a second for 20 minutes: at most one bucket a second (and a
    day's window 600 buckets), a few tens of KB however many lines came."""
    assert bucket_width(600.0) == 1.0 and bucket_width(86400.0) == 144.0 and bucket_width(0.5) == 0.5
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        windows = [Recent(600.0), Recent(86400.0)]
        for i in range(1200 * 200):
            for w in windows:
                w.add(1.7e9 + i / 200, 2.5)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(windows[0].buckets) == 600 and len(windows[0]) == 600 * 200
    assert len(windows[1].buckets) <= MAX_BUCKETS + 1 and len(windows[1]) == 1200 * 200
    assert used < 64 * 1024, used


def test_saved_window_loads_exactly_and_the_earlier_sample_forms_too():
    r = Recent(600.0)
    for i in range(900):
        r.add(1.7e9 + i * 0.37, 1.0 + (i % 13) / 7)
    state = r.to_state()
    back = Recent(600.0)
    back.load_state(state)
    assert back.buckets == r.buckets and (back.sum, len(back)) == (r.sum, len(r))
    samples = [(1.7e9 + i, 2.0 + i % 3) for i in range(20)]
    for saved in ({"t": state_col([t for t, _ in samples]), "v": state_col([v for _, v in samples])},
                  [list(p) for p in samples]):  # as earlier versions saved a window of samples
        old = Recent(600.0)
        old.load_state(saved)
        assert [(t, n, s) for t, n, s in old.buckets] == [(t, 1, v) for t, v in samples]


def state_col(xs: list[float]) -> str:
    from array import array

    from specwatch.rules.stats import _pack
    return _pack(array("d", xs))


def test_a_new_span_merges_the_buckets_into_the_new_width():
    r = Recent(600.0)
    for i in range(600):
        r.add(1.7e9 + i, 1.0)
    r.resize(6000.0)  # 10 s buckets
    assert r.width == 10.0 and len(r.buckets) <= 61 and len(r) == 600 and r.sum == 600.0
    assert all(math.fmod(t, 10.0) == 0 for t, _, _ in r.buckets)


def test_baseline_takes_a_bucket_as_its_samples():
    one, many = Baseline(300.0, 3600.0), Baseline(300.0, 3600.0)
    for i in range(10):
        one.add(1.7e9 + 1, 2.0)
    many.add(1.7e9 + 1, 20.0, 10)
    assert (one.count, one.mean(), one.to_state()) == (many.count, many.mean(), many.to_state())


def test_the_lines_of_one_timestamp_added_as_one_sum_make_the_same_buckets():
    """`add(t, sum, n)` per timestamp against `add(t, v)` per sample, over random whole-second
    times with bursts, gaps that age buckets out and a clock that steps back: the same bucket
    starts and counts, the same buckets aged out at the same calls; the sums equal to rounding
    (one rounding per timestamp instead of one per sample)."""
    rng = random.Random(11)
    for span in (5.0, 60.0, 86400.0):
        one, grouped, t = Recent(span), Recent(span), 1.7e9
        for _ in range(2000):
            t += rng.choice([0, 1, 1, 2, 40, 900, -1])
            values = [rng.random() * 400 for _ in range(rng.choice([1, 1, 2, 3, 8]))]
            aged_one = []
            for v in values:
                aged_one += one.add(t, v)
            aged_grouped = grouped.add(t, sum(values), len(values))
            assert [(a, n) for a, _, n in aged_grouped] == [(a, n) for a, _, n in aged_one]
            assert [s for _, s, _ in aged_grouped] == pytest.approx([s for _, s, _ in aged_one], rel=1e-12)
            assert [(a, n) for a, n, _ in grouped.buckets] == [(a, n) for a, n, _ in one.buckets]
            assert (len(grouped), grouped.oldest) == (len(one), one.oldest)
            assert grouped.sum == pytest.approx(one.sum, rel=1e-9, abs=1e-6)
