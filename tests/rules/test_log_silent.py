"""SGLangLogSilent through the real pipeline: a real launcher process (its fd 1 really points
at a file), the real HTTP API source against a local SGLang-shaped server whose scheduler
completes decode-log intervals, and decode lines fed as the follower would feed them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from fake_sglang import stop  # noqa: E402
from procs import free_port  # noqa: E402
from sglang_http import SGLangHTTP  # noqa: E402
from sglang_lines import decode_line  # noqa: E402

from specwatch.alerts.dispatcher import Dispatcher  # noqa: E402
from specwatch.config import build_config  # noqa: E402
from specwatch.core.events import LogLine  # noqa: E402
from specwatch.core.pipeline import Pipeline  # noqa: E402
from specwatch.sources.process import ProcessSource  # noqa: E402
from specwatch.sources.server_api import ServerApiSource  # noqa: E402

T0 = 1_800_000_000.0


@pytest.fixture
def box(sglang_install, sglang_procs):
    """Pipeline + process source + API source for one server; `writes_to` is its stdout file."""
    made = {}

    def _make(*, followed: Path, writes_to: Path, log_level: str = "info", intervals: int = 3):
        port = free_port()
        with open(writes_to, "a") as out:
            p = sglang_procs.start([str(sglang_install), "-m", "sglang.launch_server", "--model-path", "/models/llama",
                                    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
                                    "/models/eagle3", "--port", str(port), "--log-level", log_level], stdout=out)
        srv = SGLangHTTP("0.5.23")
        srv.args["log_level"] = log_level
        made["srv"] = srv
        cfg = build_config({"server": "box", "logs": [{"path": str(followed), "server": "sglang-a"}],
                            "rules": {"log_silent": {"intervals": intervals}}})
        pl = Pipeline(cfg, Dispatcher([]))
        ps = ProcessSource(pl.feed_event, server="box", servers={port: "sglang-a"})
        api = ServerApiSource(srv.url, pl.feed_event, server="sglang-a", timeout=0.5)
        return pl, ps, api, srv, p

    yield _make
    if "srv" in made:
        made["srv"].close()


def poll(pl, ps, api, srv, t, decoding=True):
    if decoding:
        srv.throughput += 7.5  # the scheduler completed another decode-log interval
    ps.poll(t)
    api.poll(t)
    with pl.lock:
        pl.tick(t)


def sent(pl):
    return [(a.name, a.status) for a in pl.dispatcher.history]


def test_log_level_warning(box, tmp_path):
    followed = tmp_path / "server.log"
    followed.write_text("")
    pl, ps, api, srv, p = box(followed=followed, writes_to=followed, log_level="warning")
    for i in range(3):
        poll(pl, ps, api, srv, T0 + 10 * i)
    assert sent(pl) == []  # the first poll only sets the starting point: two intervals so far
    poll(pl, ps, api, srv, T0 + 30)
    assert sent(pl) == [("SGLangLogSilent", "firing")]
    a = pl.dispatcher.history[0]
    ev = dict(a.evidence)
    assert ev["likely cause"] == "--log-level warning"
    assert ev["log_level"] == "warning"
    assert ev["decode-log intervals without a decode line"] == ">= 3"
    assert ev["followed"] == str(followed)
    assert str(followed) in ev["SGLang writes to (fd 1/2)"]
    assert a.fixes[0].startswith("SGLang runs with `--log-level warning`")
    assert "--log-level info" in a.fixes[0]
    assert a.annotations["summary"] == "No decode lines from sglang-a while it is decoding (--log-level warning)"

    # the operator restarts SGLang at info; decode lines arrive again
    line, _ = decode_line("0.5.23", accept_len=2.9)
    pl.feed(LogLine(str(followed), line), now=T0 + 41)
    assert sent(pl)[-1] == ("SGLangLogSilent", "resolved")


def test_wrong_file_followed(box, tmp_path):
    followed = tmp_path / "followed.log"
    followed.write_text("")
    actual = tmp_path / "actual.log"
    pl, ps, api, srv, p = box(followed=followed, writes_to=actual)
    for i in range(4):
        poll(pl, ps, api, srv, T0 + 10 * i)
    assert sent(pl) == [("SGLangLogSilent", "firing")]
    a = pl.dispatcher.history[0]
    assert dict(a.evidence)["likely cause"] == "wrong file followed"
    assert any(f"set `logs[].path` to `{actual}`" in f for f in a.fixes)


def test_log_moved(box, tmp_path):
    followed = tmp_path / "server.log"
    pl, ps, api, srv, p = box(followed=followed, writes_to=followed)
    followed.rename(tmp_path / "server.log.moved")  # the server keeps writing to the moved file
    for i in range(4):
        poll(pl, ps, api, srv, T0 + 10 * i)
    assert sent(pl) == [("SGLangLogSilent", "firing")]
    a = pl.dispatcher.history[0]
    ev = dict(a.evidence)
    assert ev["missing"] == str(followed)
    assert ev["likely cause"] == "wrong file followed"  # fd 1 now names the moved file
    assert str(tmp_path / "server.log.moved") in ev["SGLang writes to (fd 1/2)"]
    assert any("does not exist any more" in f and f"/proc/{p.pid}/fd/1" in f for f in a.fixes)


def test_quiet_when_lines_arrive_idle_or_prefill(box, tmp_path):
    followed = tmp_path / "server.log"
    followed.write_text("")
    pl, ps, api, srv, p = box(followed=followed, writes_to=followed)
    line, _ = decode_line("0.5.23", accept_len=2.9)
    t = T0
    for i in range(10):  # decoding, and each interval's line reaches specwatch
        poll(pl, ps, api, srv, t)
        pl.feed(LogLine(str(followed), line), now=t + 1)
        t += 10
    for i in range(10):  # idle: the scheduler completes no interval, so no line is due
        poll(pl, ps, api, srv, t, decoding=False)
        t += 10
    assert sent(pl) == []
    srv.args["disaggregation_mode"] = "prefill"  # a PD prefill server never prints decode lines
    for i in range(10):
        poll(pl, ps, api, srv, t)
        t += 10
    assert sent(pl) == []


def test_server_without_followed_log_is_not_checked(box, tmp_path):
    followed = tmp_path / "server.log"
    followed.write_text("")
    pl, ps, api, srv, p = box(followed=followed, writes_to=followed)
    api.server = "sglang-b"  # an API whose server has no `logs` entry
    for i in range(6):
        poll(pl, ps, api, srv, T0 + 10 * i)
    assert [n for n, _ in sent(pl) if n == "SGLangLogSilent"] == []


def test_server_stopping_resolves(box, tmp_path):
    followed = tmp_path / "server.log"
    followed.write_text("")
    pl, ps, api, srv, p = box(followed=followed, writes_to=followed, log_level="error")
    for i in range(4):
        poll(pl, ps, api, srv, T0 + 10 * i)
    assert sent(pl) == [("SGLangLogSilent", "firing")]
    stop(p)
    ps.poll(T0 + 50)
    assert sent(pl)[-1] == ("SGLangLogSilent", "resolved")
