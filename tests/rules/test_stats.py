"""rules/stats.Recent: the window of the last `span` seconds, its running sum, its compact store
and its saved form."""

from __future__ import annotations

import random
import tracemalloc
from collections import deque

from specwatch.rules.stats import Recent


def test_window_sum_and_aged_samples_follow_the_span_in_either_store():
    """Against the window written out plainly (a deque, the running sum updated in order), over
    random times, gaps and values, with the store swapped for a catch-up's deque now and then."""
    rng = random.Random(7)
    for span in (5.0, 30.0, 600.0):
        r, ref, total, t = Recent(span), deque(), 0.0, 0.0
        for _ in range(3000):
            if rng.random() < 0.01:
                r.samples = deque(r.samples)  # what columns.apply_recent hands over
            t += rng.choice([0, 0.1, 1, 3, 50, 700]) * rng.random()
            v = rng.random() * 5 if rng.random() < 0.9 else rng.randint(0, 100)
            add = rng.random() > 0.05  # else only a prune
            if add:
                ref.append((t, v))
                total += v
            aged = []
            while ref and ref[0][0] <= t - span:
                aged.append(ref.popleft())
                total -= aged[-1][1]
            if not ref:
                total = 0.0
            assert (r.add(t, v) if add else r.prune(t)) == aged
            assert (list(r.samples), r.sum, len(r)) == (list(ref), total, len(ref))

def test_saved_window_loads_exactly_and_the_earlier_list_form_too():
    r = Recent(600.0)
    for i in range(900):
        r.add(1.7e9 + i * 0.37, 1.0 + (i % 13) / 7)
    state = r.to_state()
    assert set(state) == {"t", "v"} and all(isinstance(s, str) for s in state.values())
    for saved in (state, [list(p) for p in r.samples]):  # now, and as earlier versions saved it
        back = Recent(600.0)
        back.load_state(saved)
        assert list(back.samples) == list(r.samples) and back.sum == sum(v for _, v in r.samples)


def test_a_full_window_takes_under_30_bytes_a_sample():
    """8 ranks, one line a second, 10 minutes: 4,800 samples (a deque of tuples held ~100 B each)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        windows = [Recent(600.0) for _ in range(8)]
        for s in range(600):
            for r in windows:
                r.add(1.7e9 + s, 2.5 + s % 10 / 100)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert used / 4800 < 30, used / 4800
