"""What the rules keep per rank does not grow with the line rate: their windows are time-bucket
sums (rules/stats.Recent), not the lines. (RSS under load is measured in bench/soak.py --rate.)"""

from __future__ import annotations

import gc
import tracemalloc

from pipelines import read_log
from procs import decode_line

RANKS, SECONDS = 8, 660  # past the longest default window (degradation: 600 s)


def retained(tmp_path, rate: int, seconds: int = SECONDS) -> int:
    """Bytes a pipeline holds after reading 8 ranks x `rate` decode lines a second for `seconds`."""
    log = tmp_path / f"rate{rate}-{seconds}.log"
    with open(log, "w") as f:
        for s in range(seconds):
            ts = f"{10 + s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"
            for k in range(rate):
                for r in range(RANKS):
                    f.write(decode_line(2.5 + (s + k + r) % 7 / 10, ts, rank=f"DP{r} TP{r}",
                                        running=1 + (s * 7 + k + r) % 60, thr=300.0 + (s + k) % 90))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        p = read_log(log, chunk=1 << 16)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert sum(st.lines["decode"] for st in p.servers.values()) == RANKS * rate * seconds
    return held


def test_rule_state_does_not_grow_with_the_line_rate(tmp_path):
    """Ten times the lines (8 ranks x 10 lines/s against 1 line/s, 11 minutes): the same state,
    give or take (~0.1 MB more); windows of lines held ~2 MB more."""
    retained(tmp_path, 1, 120)  # what the first pipeline loads for good (modules, numpy for a large read)
    slow, busy = retained(tmp_path, 1), retained(tmp_path, 10)
    assert busy - slow < 300_000, (slow, busy)
