"""A `Pipeline` that reads a whole log file as `replay` does (Follower reads, no notifiers)."""

from __future__ import annotations

import random

from specwatch.alerting import build_alerting
from specwatch.config import LogSource, build_config
from specwatch.core.pipeline import Pipeline
from specwatch.sources.filestream import Follower


def read_log(path, doc: dict | None = None, chunk: int = 1 << 20) -> Pipeline:
    """`path` read through a pipeline of config `doc` in reads of `chunk` bytes, to its end."""
    cfg = build_config(doc or {}, for_run=False)
    cfg.logs.append(LogSource(path=str(path), server=cfg.server))
    dispatcher, _ = build_alerting(cfg, state_dir=None, replay=True, notify=False, slack_dry_run=None)
    p = Pipeline(cfg, dispatcher, diagnosis_background=False)
    f = Follower(str(path), on_lines=p.feed_batch, max_line_bytes=1 << 20, read_chunk_bytes=chunk)
    while f.poll():
        pass
    f.finish()
    p.flush_errors()  # the end of the log, as replay ends it: its last lines decided
    return p


def transitions_two_ways(tmp_path, lines: list[str], doc: dict) -> tuple[list, list]:
    """The alert transitions of `lines` fed one at a time (`Pipeline.feed`: each line its own
    evaluation, as the rules decided line by line) and of the same log read whole as `replay`
    reads it (`read_log`: an evaluation holds a second of lines of every rank), each as
    (alertname, rank, status, starts_at, ends_at, evidence)."""
    from specwatch.alerts.dispatcher import Dispatcher
    from specwatch.core.events import LogLine

    path = tmp_path / "server.log"
    path.write_text("".join(line + "\n" for line in lines))
    cfg = build_config({"server": "box", "logs": [{"path": str(path)}], **doc}, for_run=False)
    one = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))
    for text in lines:
        one.feed(LogLine(str(path), text))
    one.flush_errors()
    whole = read_log(path, {"server": "box", **doc})

    def shown(p: Pipeline) -> list:
        return [(a.name, a.labels.get("rank"), a.status, a.starts_at, a.ends_at, list(a.evidence))
                for a in p.dispatcher.history]
    return shown(one), shown(whole)


def busy_log(seed: int, low: dict[int, float], thr_low: dict[int, float] | None = None) -> list[str]:
    """4 DP ranks, 0-3 decode lines each per second (whole-second stamps, several lines of a
    rank in one second, ranks interleaved, load levels mixed): 20 min healthy (accept len ~3.0,
    gen throughput ~100 token/s per load level), 6 min with rank r at accept len `low[r]` and
    gen throughput × `thr_low[r]`, 6 min healthy again."""
    from timeline import Timeline

    rnd = random.Random(seed)
    log = Timeline()
    for s in range(32 * 60):
        spell = 20 * 60 <= s < 26 * 60
        log.wait(1)
        order = [r for r in range(4) for _ in range(rnd.choice([0, 1, 1, 2, 3]))]
        rnd.shuffle(order)
        for r in order:
            a = (low.get(r, 3.0) if spell else 3.0) + rnd.uniform(-0.15, 0.15)
            running = rnd.choice([8, 12, 15, 16, 20, 31])
            thr = running.bit_length() * 100 * rnd.uniform(0.9, 1.1) * ((thr_low or {}).get(r, 1.0) if spell else 1.0)
            log.decode(every=0, accept=round(a, 2), running=running, thr=round(thr, 2), ranks=[{"DP": r, "TP": r}])
    return log.lines
