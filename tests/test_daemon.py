"""`specwatch run` as a real subprocess: a real log file, /metrics over HTTP, a local Slack."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

import procs
from procs import SAMPLES, decode_line, free_port, rank_labels, scrape, wait_for
from specwatch_daemon import SpecwatchDaemon


def Daemon(tmp_path: Path, slack_url: str, log: Path, extra: dict | None = None) -> SpecwatchDaemon:
    return SpecwatchDaemon(tmp_path, log, env={"SW_TEST_HOOK": slack_url}, extra=extra, alerts={
        "group_wait": "0s", "group_interval": "0s",
        "slack": {"webhook_url_env": "SW_TEST_HOOK", "backoff_initial": "0.1s", "backoff_max": "1s"}})


@pytest.fixture
def log(tmp_path):
    return tmp_path / "sglang.log"


def delivered(slack) -> list[dict]:
    """Bodies Slack answered 200 ok to (the endpoint records failed attempts too)."""
    return [b for b, ok in zip(slack.received, slack.answered_ok) if ok]


def test_run_scrape_alert_resolve_restart(tmp_path, slack, log):
    # Slack is flaky: two 500s, then a 429 asking for 1 s, then fine.
    slack.script.extend([(500, {}, "rollup_error"), (500, {}, "rollup_error"),
                         (429, {"Retry-After": "1"}, "rate_limited")])
    d = Daemon(tmp_path, slack.url, log)
    d.start()
    landing = urllib.request.urlopen(f"http://127.0.0.1:{d.port}/", timeout=5).read().decode()
    assert "/metrics" in landing and str(log) in landing

    # the file appears after start: read from its first line
    real = (SAMPLES / "kimi-k25-eagle3-collapse.log").read_text()
    with open(log, "a") as f:
        f.write("[2026-02-23 16:32:30] INFO:     127.0.0.1:40052 - \"POST /generate HTTP/1.1\" 200 OK\n")
        f.write(real)
        f.write(decode_line(1.04, "16:32:46"))
    m = wait_for(lambda: (x := scrape(d.port)).get(("specwatch_decode_batches_total", rank_labels())) == 3 and x,
                 what="3 decode batches")
    lab = rank_labels()
    assert m[("specwatch_accept_length", lab)] == 1.04
    assert m[("specwatch_accept_rate", lab)] == 0.21
    assert m[("specwatch_gen_throughput_tokens_per_second", lab)] == 400.57
    assert m[("specwatch_running_requests", lab)] == 32
    assert m[("specwatch_queued_requests", lab)] == 0
    assert m[("specwatch_token_usage_ratio", lab)] == 0.02
    assert m[("specwatch_cuda_graph_enabled", lab)] == 0
    assert m[("specwatch_acceptance_collapsed", lab)] == 1
    assert m[("specwatch_log_lines_total", (("kind", "other"), ("server", "gpu-box-1")))] == 1
    assert m[("specwatch_log_lines_total", (("kind", "decode"), ("server", "gpu-box-1")))] == 3
    assert m[("specwatch_log_lines_total", (("kind", "malformed"), ("server", "gpu-box-1")))] == 0

    firing = wait_for(lambda: delivered(slack), timeout=20, what="the firing message")
    assert len(firing) == 1
    assert firing[0]["text"].startswith("[FIRING] AcceptanceCollapse on gpu-box-1 TP0")
    assert len(slack.received) == 4  # 500, 500, 429, ok
    assert slack.times[3] - slack.times[2] >= 0.95  # Retry-After honoured

    # recovery: three healthy batches
    with open(log, "a") as f:
        for i in range(3):
            f.write(decode_line(2.9, f"16:33:0{i}"))
    wait_for(lambda: len(delivered(slack)) == 2, timeout=20, what="the resolved message")
    assert delivered(slack)[1]["text"].startswith("[RESOLVED] AcceptanceCollapse on gpu-box-1 TP0")
    assert scrape(d.port)[("specwatch_acceptance_collapsed", lab)] == 0
    assert scrape(d.port)[("specwatch_notifications_sent_total", (("notifier", "slack"),))] == 2

    rc, out = d.stop()
    assert rc == 0, out
    assert slack.url.split("/")[-1] not in out  # the webhook secret never printed
    state, outbox = d.saved()
    assert str(log) in state["offsets"] and outbox == {}

    # restart: resumes after the last line, counts nothing twice, sends nothing again
    with open(log, "a") as f:
        f.write(decode_line(3.1, "16:34:00"))
    d.start()
    # counters go on from the 6 saved with the offsets: only the one new line is added
    m = wait_for(lambda: (x := scrape(d.port)).get(("specwatch_decode_batches_total", lab)) == 7 and x,
                 what="the one new decode batch after restart")
    assert m[("specwatch_log_lines_total", (("kind", "decode"), ("server", "gpu-box-1")))] == 7
    assert m[("specwatch_accept_length", lab)] == 3.1
    time.sleep(0.5)
    assert len(delivered(slack)) == 2
    rc, out = d.stop()
    assert rc == 0, out


def test_bad_config_exits_2_naming_the_key(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("logs:\n  - path: /tmp/x.log\nrules:\n  collapse:\n    min_batches: zero\n")
    r = procs.run([sys.executable, "-m", "specwatch", "run", "--config", str(cfg)],
                  capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "rules.collapse.min_batches: must be an integer" in r.stderr


def test_collapse_alert_carries_the_diagnosis(tmp_path, slack, log, sglang_roots):
    """server_args line → probes in the background → the collapse alert (or its one update) lists
    the findings, errors first; the firing message itself never waits for them."""
    ck = Path(__file__).resolve().parent / "data" / "checkpoints"
    d = Daemon(tmp_path, slack.url, log, extra={"diagnosis": {"sglang_root": str(sglang_roots["0.5.11"])}})
    d.start()
    with open(log, "a") as f:
        f.write(f"[2026-02-23 16:30:00] server_args=ServerArgs(model_path='{ck / 'target-llama'}', "
                f"speculative_algorithm='EAGLE', speculative_draft_model_path='{ck / 'speculators-converted'}', "
                "speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)\n")
        for i in range(3):
            f.write(decode_line(1.02, f"16:32:3{i}"))

    def with_findings():
        msgs = delivered(slack)
        return msgs if any("[error] unloaded_weights" in json.dumps(m) for m in msgs) else None

    msgs = wait_for(with_findings, timeout=30, what="a Slack message with the diagnosis")
    assert 1 <= len(msgs) <= 2  # the alert, and at most one update
    assert msgs[0]["text"].startswith("[FIRING] AcceptanceCollapse on gpu-box-1 TP0")
    last = json.dumps(msgs[-1])
    assert last.index("[error] config_format") < last.index("Unloaded draft weights")  # findings first
    assert "fc_bypass" in last
    time.sleep(1.5)
    assert len(delivered(slack)) == len(msgs)  # nothing more in this episode
    rc, out = d.stop()
    assert rc == 0, out


def test_collapse_alert_without_an_sglang_source_says_the_draft_was_not_checked(tmp_path, slack, log):
    """No diagnosis.sglang_root, no importable sglang, no configured server process: the Slack
    message says why it has no findings (never a silent, or guessed, all-clear)."""
    ck = Path(__file__).resolve().parent / "data" / "checkpoints"
    d = Daemon(tmp_path, slack.url, log)
    d.start()
    with open(log, "a") as f:
        f.write(f"[2026-02-23 16:30:00] server_args=ServerArgs(model_path='{ck / 'target-llama'}', "
                f"speculative_algorithm='EAGLE3', speculative_draft_model_path='{ck / 'speculators-converted'}')\n")
        for i in range(3):
            f.write(decode_line(1.02, f"16:32:3{i}"))
    msgs = wait_for(lambda: delivered(slack), timeout=30, what="the collapse alert")
    time.sleep(1.5)  # an update, if any, too
    text = json.dumps(delivered(slack))
    assert "not checked: no SGLang source found (set diagnosis.sglang_root" in text, text
    assert "assumed" not in text and msgs[0]["text"].startswith("[FIRING] AcceptanceCollapse")
    rc, out = d.stop()
    assert rc == 0, out


def test_first_start_on_an_old_log_sends_no_old_episode(tmp_path, slack, log):
    """A week-old episode (fired and resolved) in the backlog is not news; a new collapse is."""
    with open(log, "w") as f:
        for i in range(3):
            f.write(decode_line(1.0, f"10:00:0{i}").replace("2026-02-23", "2026-02-16"))
        for i in range(3):
            f.write(decode_line(2.9, f"10:01:0{i}").replace("2026-02-23", "2026-02-16"))
    d = Daemon(tmp_path, slack.url, log)
    d.start()
    wait_for(lambda: scrape(d.port).get(("specwatch_decode_batches_total", rank_labels())) == 6, what="the backlog")
    time.sleep(2.5)  # past the first poll round and group_wait
    assert slack.received == []
    with open(log, "a") as f:
        for i in range(3):
            f.write(decode_line(1.01, f"16:40:0{i}"))
    msgs = wait_for(lambda: delivered(slack), timeout=15, what="the new collapse")
    assert len(msgs) == 1 and msgs[0]["text"].startswith("[FIRING] AcceptanceCollapse on gpu-box-1 TP0")
    rc, out = d.stop()
    assert rc == 0, out


def test_missing_log_is_warned_about_and_bad_state_dir_is_a_clean_error(tmp_path, slack, log):
    d = Daemon(tmp_path, slack.url, tmp_path / "not-there" / "server.log")
    d.start()
    time.sleep(3.0)  # the warning comes after five poll intervals, at least 2 s
    rc, out = d.stop()
    assert rc == 0
    assert f"log file {tmp_path / 'not-there' / 'server.log'} does not exist" in out

    cfg = tmp_path / "bad.yaml"
    (tmp_path / "afile").write_text("x")
    cfg.write_text(f"logs:\n  - path: {log}\nstate_dir: {tmp_path / 'afile' / 'state'}\n"
                   f"metrics:\n  listen_port: {free_port()}\ngpu:\n  enabled: false\n")
    r = procs.run([sys.executable, "-m", "specwatch", "run", "--config", str(cfg)],
                  capture_output=True, text=True, timeout=30)
    # a config error (as check-config says): the key, why, exit 2
    assert r.returncode == 2
    assert f"  state_dir: {tmp_path / 'afile'} is not a directory (a parent of {tmp_path / 'afile' / 'state'})" \
        in r.stderr and "Traceback" not in r.stderr


def _live(ago: float) -> tuple[str, str]:
    """(day, time) `ago` seconds back in local time, as a live SGLang stamps its lines."""
    t = time.localtime(time.time() - ago)
    return time.strftime("%Y-%m-%d", t), time.strftime("%H:%M:%S", t)


def test_collapse_after_a_restart_reaches_slack_within_a_second(tmp_path, slack, log):
    """Issue #10 item 1, default alert timers: a collapse, a restart (new server_args line) while
    it fires, a second collapse. The first episode's RESOLVED and the second's FIRING each reach
    Slack within about a second of their line, not after group_interval."""
    from sglang_lines import server_args_line

    d = SpecwatchDaemon(tmp_path, log, env={"SW_TEST_HOOK": slack.url}, alerts={
        "slack": {"webhook_url_env": "SW_TEST_HOOK", "backoff_initial": "0.1s"}})
    d.start()

    def write(*lines: str) -> float:
        with open(log, "a") as f:
            f.write("".join(lines))
        return time.monotonic()

    lines = [decode_line(2.8, t, day=day) for day, t in (_live(8), _live(7), _live(6))]
    lines += [decode_line(1.02, t, day=day) for day, t in (_live(3), _live(2), _live(1))]
    t0 = write(*lines)
    wait_for(lambda: len(delivered(slack)) == 1, timeout=10, what="the first collapse")
    assert slack.times[-1] - t0 < 2.0
    day, now = _live(0)
    args_line, _ = server_args_line(ts=f"{day} {now}")
    t1 = write(args_line + "\n", *[decode_line(1.02, now, day=day) for _ in range(4)])
    wait_for(lambda: len(delivered(slack)) == 3, timeout=10, what="the restart's resolve and the new collapse")
    texts = [b["text"] for b in delivered(slack)]
    assert texts[1].startswith("[RESOLVED] AcceptanceCollapse on gpu-box-1 TP0")
    assert texts[2].startswith("[FIRING] AcceptanceCollapse on gpu-box-1 TP0")
    assert slack.times[-1] - t1 < 2.0
    assert scrape(d.port)[("specwatch_alerts_firing", (("alertname", "AcceptanceCollapse"),))] == 1

    rc, out = d.stop()
    assert rc == 0, out


def test_own_process_metrics_landing_page_and_taken_port(tmp_path, log):
    log.write_text((SAMPLES / "kimi-k25-eagle3-collapse.log").read_text())
    started = time.time()
    d = SpecwatchDaemon(tmp_path, log)
    d.start()
    try:
        wait_for(lambda: d.scrape().get(("specwatch_decode_batches_total", rank_labels())) == 2, what="2 decode batches")
        m = d.scrape()
        me = psutil.Process(d.proc.pid)
        rss, cpu = me.memory_info().rss, sum(me.cpu_times()[:2])
        # prometheus_client's ProcessCollector, read from the daemon's own /proc entry
        assert 10 * 2**20 < m[("process_resident_memory_bytes", ())] < 200 * 2**20
        assert abs(m[("process_resident_memory_bytes", ())] - rss) < 8 * 2**20
        assert 0 < m[("process_cpu_seconds_total", ())] <= cpu + 0.05
        assert started - 5 < m[("process_start_time_seconds", ())] <= time.time()
        assert m[("process_open_fds", ())] > 3
        page = urllib.request.urlopen(f"http://127.0.0.1:{d.port}/", timeout=5)
        assert page.headers["Content-Type"].startswith("text/html") and b"/metrics" in page.read()
        assert ("specwatch_build_info" in {k[0] for k in scrape(d.port)})

        # a second daemon on the same port (its own state_dir): a clear error, exit 1
        other = tmp_path / "other.yaml"
        other.write_text(d.cfg.read_text().replace(str(d.state), str(tmp_path / "other-state")))
        r = procs.run([sys.executable, "-m", "specwatch", "run", "--config", str(other)],
                      capture_output=True, text=True, timeout=30)
        assert r.returncode == 1
        assert f"cannot listen on 127.0.0.1:{d.port}: Address already in use" in r.stderr
        assert "Traceback" not in r.stderr
    finally:
        rc, out = d.stop()
    assert rc == 0, out


def test_daemon_modules_leave_heavy_libraries_unloaded():
    """RSS budget: requests (~6 MB) loads at the first delivery, numpy/safetensors only for a probe."""
    code = ("import sys; import specwatch.cli, specwatch.daemon, specwatch.alerting, specwatch.notifiers.slack, "
            "specwatch.notifiers.webhook, specwatch.notifiers.alertmanager, specwatch.sources.nvml; "
            "print(sorted(m for m in ('requests', 'urllib3', 'numpy', 'safetensors', 'pynvml') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def _built_daemon(tmp_path: Path, **extra):
    from specwatch.config import build_config
    from specwatch.daemon import Daemon

    cfg = build_config({"state_dir": str(tmp_path / "state"), "gpu": {"enabled": False}, **extra, "logs": [
        {"path": str(tmp_path / "sglang.log"), "server": "box"},
        {"path": str(tmp_path / "custom.log"), "server": "other",
         "format": {"regex": r"(?P<timestamp>\S+ \S+) (?P<message>.*)"}}]}, for_run=True)
    d = Daemon(cfg)
    d._build()
    return d


def test_a_busy_log_is_read_at_the_pace_a_collapse_needs(tmp_path):
    """The followers' cadence (sources/cadence.py) as the daemon sets it up: after a read with an
    accept len at or below rules.collapse.max_accept_length (1.10), also in a log with a
    `format:` grammar (it rewrites the prefix; the message keeps `accept len: X`), the next round
    comes `fast`; else within the time the busiest rank takes to print min_batches - 1 (2)
    decode lines, between `fast` (poll_interval / READ_SPAN) and `slow` (READ_SPAN intervals)."""
    from specwatch.daemon import READ_SPAN
    from specwatch.sources.cadence import ARM_SECONDS
    from specwatch.sources.filestream import LineBatch

    d = _built_daemon(tmp_path)
    c = d.cadence
    assert (c.fast, c.slow) == (0.75 / READ_SPAN, 0.75 * READ_SPAN) and c.min_batches == 3
    sglang, custom = str(tmp_path / "sglang.log"), str(tmp_path / "custom.log")

    t = [100.0]
    c.clock = lambda: t[0]

    def read(path: str, *lines: str, after: float = 1.0) -> float:  # lines read `after` s after the last round
        t[0] += after
        data = "".join(lines).encode()
        c.saw(LineBatch(path, 0, len(data), block=data))
        return c.next_round()

    def ranks(n: int, accept: float = 2.5) -> list[str]:
        return [decode_line(accept, "10:00:00", rank=f"DP{r} TP{r}") for r in range(n)]

    c.next_round()
    assert read(sglang, *ranks(8), after=2.0) == c.slow  # 8 ranks, a line each in 2 s: 4 s for two
    assert read(sglang, *ranks(8) * 2, after=1.0) == 2 * 1.0 / 2  # two each in 1 s: 2 lines take 1 s
    assert read(str(tmp_path / "one.log"), *ranks(1) * 40, after=1.0) == c.fast  # one rank, 40 lines a second
    assert read(sglang, *ranks(3), decode_line(1.10, "10:00:00", rank="DP3 TP3")) == c.fast
    assert read(sglang, *ranks(8), after=2.0) == c.fast  # the rest of a run is read as it comes
    t[0] += ARM_SECONDS
    assert read(sglang, *ranks(8), after=2.0) == c.slow
    assert read(sglang, "[2026-02-23 10:00:00] Prefill batch, #new-seq: 1\n" * 40) == c.slow  # no decode line
    vllm = "INFO 02-23 10:00:00 [metrics.py:96] SpecDecoding metrics: Mean acceptance length: 1.00, Accepted: 0 tokens\n"
    assert read(str(tmp_path / "vllm.log"), vllm * 40) == c.slow  # one per 10 s: nothing to arm for
    custom_line = "2026-02-23 10:00:00 " + decode_line(1.05, "10:00:00").split("] ", 1)[1]
    assert read(custom, custom_line) == c.fast
    assert read(custom, custom_line.replace("1.05", "2.50")) == c.fast  # armed since the last
    d.followers.stop()


def test_no_slow_rounds_when_the_log_silent_polls_come_faster(tmp_path):
    """rules.log_silent fires after `intervals` API polls without a decode line: with polls that
    close together, lines read that late would look missing, so a busy log's rounds come at least
    every poll interval."""
    fast = _built_daemon(tmp_path / "a", server_api={"url": "http://127.0.0.1:1", "interval": "1s", "timeout": "0.5s"})
    assert fast.cadence.slow == fast.config.follow.poll_interval
    slow = _built_daemon(tmp_path / "b", server_api={"url": "http://127.0.0.1:1", "interval": "10s"})
    assert slow.cadence.slow > slow.config.follow.poll_interval


def test_the_after_poll_tick_skips_a_second_tick_the_lines_gave(tmp_path):
    """A round whose lines ticked the pipeline (`Pipeline.last_tick`, the lines' wall clock) needs
    no tick from the after-poll hook within TICK_EVERY; a clock set back makes one due."""
    from specwatch.daemon import TICK_EVERY

    d = _built_daemon(tmp_path)
    with d.pipeline.lock:
        assert d._tick_due()  # never ticked
        d.pipeline.tick(time.time())
        assert not d._tick_due()
        d.pipeline.tick(time.time() - 2 * TICK_EVERY)
        assert d._tick_due()
        d.pipeline.tick(time.time() + 3600)  # then the clock was set back an hour
        assert d._tick_due()
        d._tick()
        assert not d._tick_due()  # this daemon's own tick
