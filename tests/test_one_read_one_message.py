"""What one live read hands the dispatcher goes out together (`Pipeline.feed_batch` inside
`Dispatcher.together`): 8 ranks collapsing in one read are one message even when a tick falls
due in the middle of the read; 8 ranks' watchdog lines are one message naming the 8 ranks; and a
rank disagreement that fires and resolves within the read (the first of 8 ranks collapsing
together) is never sent. A real Follower reads a real file; the notifier records what it gets."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "alerts"))
from sglang_lines import decode_line  # noqa: E402
from test_dispatcher import Recorder  # noqa: E402

from specwatch.alerts.dispatcher import Dispatcher  # noqa: E402
from specwatch.config import build_config  # noqa: E402
from specwatch.core.pipeline import Pipeline  # noqa: E402
from specwatch.sources.filestream import Follower  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "samples" / "bugreport-logs"
T0 = datetime(2026, 3, 1, 10, 0, 0).timestamp()


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


class Box:
    def __init__(self, tmp_path: Path):
        self.log = tmp_path / "server.log"
        self.log.write_text("")
        cfg = build_config({"server": "box", "logs": [{"path": str(self.log)}], "diagnosis": {"enabled": False}})
        self.rec = Recorder()
        self.p = Pipeline(cfg, Dispatcher([self.rec], group_wait=0, group_interval=60))
        self.now = T0
        self.follower = Follower(str(self.log), on_lines=lambda b: self.p.feed_batch(b, now=self.now))

    def read(self, now: float, lines: list[str]) -> None:
        """The lines written at once, read in one read at wall time `now`."""
        self.now = now
        with open(self.log, "a") as f:
            f.write("".join(line + "\n" for line in lines))
        while self.follower.poll():
            pass

    def tick(self, now: float) -> None:
        with self.p.lock:
            self.p.tick(now)


def ranks(t: float, accept: float, n: int = 8) -> list[str]:
    return [decode_line("0.5.23", ts=stamp(t), rank={"DP": r, "TP": r}, accept_len=accept)[0] for r in range(n)]


def test_eight_ranks_collapsing_in_one_read_are_one_message_though_a_tick_falls_due_in_it(tmp_path):
    box = Box(tmp_path)
    for s in range(6):
        box.read(T0 + s, ranks(T0 + s, 2.8))
        box.tick(T0 + s)
    # each read 1.5 s after the last tick: the summariser's tick falls due after the read's first line
    for s in range(6, 9):
        box.read(T0 + s + 0.5, ranks(T0 + s, 1.02))
    got = [sorted(n) for n in box.rec.summary()]  # no RankDisagreement: DP0's fired and resolved in the read
    assert got == [[f"firing:AcceptanceCollapse:DP{r} TP{r}" for r in range(8)]], got


def test_a_watchdog_on_eight_ranks_is_one_message_naming_them(tmp_path):
    """BR-45: `Scheduler watchdog timeout` on all 8 DP ranks in one second, read at once."""
    box = Box(tmp_path)
    lines = (DATA / "BR-45.log").read_text().splitlines()
    box.read(datetime(2026, 6, 24, 8, 13, 1).timestamp(), [ln for ln in lines if not ln.startswith("#")])
    assert len(box.rec.got) == 1, box.rec.summary()
    [alert] = box.rec.got[0].alerts
    assert alert.labels["alertname"] == "ServerLogError"
    text = str(alert.evidence) + alert.annotations["summary"]
    assert all(f"DP{r} TP{r}" in text for r in range(8)), text
