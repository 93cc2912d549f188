"""limits.max_ranks_per_server: a log naming thousands of distinct ranks keeps /metrics, the rules'
state and the status page to the limit; the lines of further ranks are summed into rank "other",
counted (`specwatch_rank_overflow_lines_total`) and warned about once."""

from __future__ import annotations

import urllib.request

import pytest

from pipelines import read_log
from procs import decode_line, rank_labels, wait_for
from specwatch.core.pipeline import OTHER_RANK
from specwatch_daemon import SpecwatchDaemon

RANKS = 3000


def rank_lines(first: int, last: int, ts: str, accept: float = 2.9) -> list[str]:
    return [decode_line(accept, ts, rank=f"DP{r} TP{r}") for r in range(first, last)]


def other_labels(server="gpu-box-1"):
    return tuple(sorted({"server": server, "dp_rank": "other", "tp_rank": "other", "pp_rank": "other",
                         "ep_rank": "other", "engine": "sglang"}.items()))


def test_thousands_of_ranks_keep_metrics_small_counted_and_warned_once(tmp_path):
    """A start-up backlog of 3,000 ranks, then 3,000 more lines of them live: 64 ranks keep
    their series, every other line is in rank "other" and in the overflow counter."""
    log = tmp_path / "sglang.log"
    with open(log, "w") as f:
        f.writelines(rank_lines(0, RANKS, "16:00:00") + rank_lines(0, RANKS, "16:00:01"))
    d = SpecwatchDaemon(tmp_path, log).start()
    try:
        wait_for(lambda: d.scrape().get(("specwatch_log_lines_total", (("kind", "decode"), ("server", "gpu-box-1"))))
                 == 2 * RANKS, timeout=120, what="the backlog read")
        with open(log, "a") as f:
            f.writelines(rank_lines(0, RANKS, "16:00:02"))
        m = wait_for(lambda: (x := d.scrape()).get(("specwatch_log_lines_total", (("kind", "decode"),
                                                    ("server", "gpu-box-1")))) == 3 * RANKS and x,
                     timeout=120, what="the live lines")
        body = urllib.request.urlopen(f"http://127.0.0.1:{d.port}/metrics", timeout=10).read()
        page = urllib.request.urlopen(f"http://127.0.0.1:{d.port}/", timeout=10).read()
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    decode = {dict(k[1])["dp_rank"]: v for k, v in m.items() if k[0] == "specwatch_decode_batches_total"}
    assert len(decode) == 65 and all(decode[str(r)] == 3 for r in range(64)), sorted(decode)[:70]
    assert decode["other"] == 3 * (RANKS - 64)
    assert m[("specwatch_rank_overflow_lines_total", (("server", "gpu-box-1"),))] == 3 * (RANKS - 64)
    assert m[("specwatch_accept_length", other_labels())] == 2.9
    assert ("specwatch_accept_length", rank_labels(dp="64", tp="64")) not in m
    assert len(body) < 150_000, len(body)  # 3,000 ranks' series: megabytes
    assert b"DP100 TP100" not in page
    warned = [line for line in out.splitlines() if "limits.max_ranks_per_server" in line]
    assert len(warned) == 1 and "WARNING" in warned[0] and "'DP64 TP64'" in warned[0], warned


@pytest.mark.parametrize("chunk", [300, 1 << 20])
def test_ranks_past_the_limit_are_one_rank_for_the_rules(tmp_path, chunk):
    """In small reads and in a large one alike: the first `limit` ranks keep theirs, the rest are
    OTHER_RANK in every per-rank rule; a collapse of ranks past the limit fires on it."""
    log = tmp_path / "sglang.log"
    lines = []
    for s in range(40):
        accept = 1.0 if s >= 30 else 2.9  # every rank collapsed over the last 10 s
        lines += rank_lines(0, 500, f"16:00:{s:02d}", accept)
    log.write_text("".join(lines))
    p = read_log(log, {"limits": {"max_ranks_per_server": 8}}, chunk=chunk)
    server = p.config.server
    assert sorted(r for _, r in p.ranks) == sorted([f"DP{r} TP{r}" for r in range(8)] + [OTHER_RANK])
    assert p.rank_overflow == {server: 40 * 492}
    assert p.ranks[(server, OTHER_RANK)].decode_batches == 40 * 492
    assert all(rs.last_ts is not None for rs in p.ranks.values())
    fired = {a.labels["rank"] for a in p.dispatcher.history if a.name == "AcceptanceCollapse"}
    assert OTHER_RANK in fired and len(fired) == 9, fired
