"""`specwatch run` with the process and HTTP API sources, end to end: a fake SGLang launcher
(real processes, real venv, a real HTTP API on its --port, decode lines on its stdout) watched by
the daemon as a subprocess; metrics scraped over HTTP; alerts delivered to a local Slack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_sglang import stop  # noqa: E402
from procs import decode_line, free_port, popen  # noqa: E402
from specwatch_daemon import SpecwatchDaemon  # noqa: E402
from test_daemon import delivered, scrape, wait_for  # noqa: E402


def server_argv(python: Path, port: int, steps: int, level: str) -> list[str]:
    return [str(python), "-m", "sglang.launch_server", "--model-path", "/models/meta-llama/Llama-3.1-8B-Instruct",
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/eagle3-llama3.1-8b",
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1), "--port", str(port), "--log-level", level]


def texts(slack) -> list[str]:
    return [b["text"] for b in delivered(slack)]


def test_daemon_watches_process_and_api(tmp_path, slack, sglang_install, sglang_procs):
    python = sglang_install
    sglang_port = free_port()
    log = tmp_path / "sglang.log"
    env = {"FAKE_SGLANG_HTTP": "1"}
    with open(log, "a") as out:
        server = sglang_procs.start(server_argv(python, sglang_port, 3, "warning"), stdout=out, env=env)
    port = free_port()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        f"server: gpu-box-1\n"
        f"logs:\n  - path: {log}\n    server: sglang-a\n"
        f"follow:\n  poll_interval: 0.2s\n"
        f"metrics:\n  listen_port: {port}\n"
        f"state_dir: {tmp_path / 'state'}\n"
        f"gpu:\n  enabled: false\n"
        f"process:\n  interval: 300ms\n  servers: {{{sglang_port}: sglang-a}}\n"
        f"server_api:\n  url: http://127.0.0.1:{sglang_port}\n  server: sglang-a\n  interval: 300ms\n"
        f"  timeout: 200ms\n  backoff_max: 600ms\n"
        f"rules:\n  server: {{down_for: 1s, restart_window: 3s}}\n  log_silent: {{intervals: 2}}\n"
        f"alerts:\n  group_by: ['...']\n  group_wait: 0s\n  group_interval: 0s\n"
        f"  slack:\n    webhook_url_env: SW_TEST_HOOK\n    backoff_initial: 0.1s\n"
    )
    daemon = popen([sys.executable, "-m", "specwatch", "run", "--config", str(cfg)],
                              env=dict(os.environ, SW_TEST_HOOK=slack.url, PYTHONUNBUFFERED="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        srv = (("server", "sglang-a"),)
        m = wait_for(lambda: (x := _scrape(port)) and x.get(("specwatch_server_up", srv)) == 1
                     and x.get(("specwatch_server_avg_accept_length_lifetime", (("dp_rank", "0"), ("server", "sglang-a"))))
                     # /model_info is read after /server_info: wait for the architecture too
                     and any(k[0] == "specwatch_server_info" and dict(k[1]).get("architecture")
                             # and the process scan's version (the API's own may come first)
                             and dict(k[1]).get("sglang_version") == "0.5.6.post2" for k in x)
                     and x, timeout=30, what="server up and its API read")
        info = [k for k in m if k[0] == "specwatch_server_info"]
        assert len(info) == 1
        labels = dict(info[0][1])
        assert labels == {"server": "sglang-a", "algorithm": "EAGLE3", "draft_model": "/models/eagle3-llama3.1-8b",
                          "model": "/models/meta-llama/Llama-3.1-8B-Instruct", "sglang_version": "0.5.6.post2",
                          "architecture": "LlamaForCausalLM", "tp_size": "1", "dp_size": "1", "pp_size": "1",
                          "port": str(sglang_port)}
        assert m[("specwatch_server_avg_accept_length_lifetime", (("dp_rank", "0"), ("server", "sglang-a")))] == 2.75
        assert m[("specwatch_server_restarts_total", srv)] == 0
        assert m[("specwatch_server_start_time_seconds", srv)] == pytest.approx(
            __import__("psutil").Process(server.pid).create_time())
        for role in ("main", "scheduler", "detokenizer"):
            key = (("role", role), ("server", "sglang-a"))
            assert m[("specwatch_server_processes", key)] == 1
            assert m[("specwatch_server_resident_memory_bytes", key)] > 1_000_000
            assert ("specwatch_server_cpu_seconds_total", key) in m
        assert m[("specwatch_server_api_up", srv)] == 1
        assert m[("specwatch_server_healthy", srv)] == 1

        # --log-level warning: the scheduler decodes, no decode line ever reaches the log
        wait_for(lambda: any(t.startswith("[FIRING] SGLangLogSilent on sglang-a") for t in texts(slack)),
                 timeout=20, what="the log-silent alert")
        silent = next(b for b in delivered(slack) if b["text"].startswith("[FIRING] SGLangLogSilent"))
        assert "--log-level warning" in str(silent["blocks"])

        # the server dies: down after 1 s; the silence is no longer the issue
        stop(server)
        wait_for(lambda: any(t.startswith("[FIRING] ServerDown on sglang-a") for t in texts(slack)),
                 timeout=20, what="the down alert")
        assert _scrape(port)[("specwatch_server_up", srv)] == 0
        # another alert group's message: it may come a moment after
        wait_for(lambda: any(t.startswith("[RESOLVED] SGLangLogSilent") for t in texts(slack)), timeout=20,
                 what="the log-silent alert resolved")

        # it comes back with other flags and at info: decode lines flow, the restart is reported
        with open(log, "a") as out:
            server = sglang_procs.start(server_argv(python, sglang_port, 5, "info"), stdout=out, env=env)
        wait_for(lambda: any(t.startswith("[FIRING] ServerRestarted on sglang-a") for t in texts(slack)),
                 timeout=20, what="the restart alert")
        restart = next(b for b in delivered(slack) if b["text"].startswith("[FIRING] ServerRestarted"))
        assert "3 → 5" in str(restart["blocks"])  # speculative_num_steps old → new
        # another alert group's message: it may come a moment after
        wait_for(lambda: any(t.startswith("[RESOLVED] ServerDown") for t in texts(slack)), timeout=20,
                 what="the down alert resolved")
        m = wait_for(lambda: (x := _scrape(port)).get(("specwatch_decode_batches_total",
                     (("dp_rank", ""), ("engine", "sglang"), ("ep_rank", ""), ("pp_rank", ""), ("server", "sglang-a"), ("tp_rank", "")))) and x,
                     what="decode lines from the restarted server")
        assert m[("specwatch_server_restarts_total", srv)] == 1
        assert m[("specwatch_server_up", srv)] == 1
        wait_for(lambda: any(t.startswith("[RESOLVED] ServerRestarted") for t in texts(slack)),
                 timeout=20, what="the restart alert to resolve after restart_window")
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=20)
    assert daemon.returncode == 0, out
    assert slack.url.split("/")[-1] not in out


def _scrape(port: int) -> dict:
    try:
        return scrape(port)
    except OSError:
        return {}


def _status_servers(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=10) as r:
        return [x["server"] for x in json.load(r)["servers"]]


def test_only_configured_servers_page_and_a_disabled_source_clears_its_alerts(tmp_path, slack, sglang_install,
                                                                              sglang_procs):
    """process.servers empty: the server writing to the followed log is the log's server; a stray
    SGLang process on the box (started first) is shown as `server:port`, never leaks its settings
    into the log server's alerts and is forgotten when it exits. The log server's down alert
    resolves once a restart comes up with process watching off (issue 10 item 3)."""
    from specwatch_daemon import SpecwatchDaemon

    log = tmp_path / "sglang.log"
    stray_port, port = free_port(), free_port()
    stray_argv = server_argv(sglang_install, stray_port, 3, "info")
    stray_argv[stray_argv.index("/models/eagle3-llama3.1-8b")] = "/scratch/notebook-draft"
    stray = sglang_procs.start(stray_argv)
    with open(log, "a") as out:
        server = sglang_procs.start(server_argv(sglang_install, port, 3, "info"), stdout=out)
    d = SpecwatchDaemon(tmp_path, log, env={"SW_TEST_HOOK": slack.url},
                        rules={"server": {"down_for": "1s"}},
                        extra={"process": {"interval": "300ms"}},
                        alerts={"group_by": ["..."], "group_wait": "0s", "group_interval": "0s",
                                "slack": {"webhook_url_env": "SW_TEST_HOOK", "backoff_initial": "0.1s"}})
    d.start()
    try:
        ours, theirs = (("server", "gpu-box-1"),), (("server", f"gpu-box-1:{stray_port}"),)
        m = wait_for(lambda: (x := _scrape(d.port)).get(("specwatch_server_up", ours)) == 1
                     and x.get(("specwatch_server_up", theirs)) == 1 and x, timeout=20, what="both servers found")
        info = {dict(k[1])["server"]: dict(k[1]) for k in m if k[0] == "specwatch_server_info"}
        assert info["gpu-box-1"]["port"] == str(port)
        assert info["gpu-box-1"]["draft_model"] == "/models/eagle3-llama3.1-8b"
        assert info[f"gpu-box-1:{stray_port}"]["draft_model"] == "/scratch/notebook-draft"
        assert f"gpu-box-1:{stray_port}" in _status_servers(d.port)

        # the stray exits: its series go (and its entry on the status page), and no down alert, then or later
        stop(stray)
        wait_for(lambda: ("specwatch_server_up", theirs) not in _scrape(d.port), timeout=10,
                 what="the stray's series to go")
        assert f"gpu-box-1:{stray_port}" not in _status_servers(d.port) and "gpu-box-1" in _status_servers(d.port)
        with open(log, "a") as f:
            for i in range(3):
                f.write(decode_line(2.8, f"10:00:0{i}"))
            for i in range(3):
                f.write(decode_line(1.02, f"10:00:1{i}"))
        collapse = wait_for(lambda: [b for b in delivered(slack) if b["text"].startswith("[FIRING] AcceptanceCollapse")],
                            timeout=20, what="the collapse alert")
        body = json.dumps(collapse[0])
        assert "/models/eagle3-llama3.1-8b" in body and "notebook-draft" not in body
        time.sleep(1.5)  # past down_for
        assert not any("ServerDown" in t for t in texts(slack))

        # the log's server exits: it is a configured server, so it is down
        stop(server)
        wait_for(lambda: any(t.startswith("[FIRING] ServerDown on gpu-box-1") for t in texts(slack)),
                 timeout=20, what="the down alert of the log's server")
        assert not any(f"gpu-box-1:{stray_port}" in t for t in texts(slack))
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    assert "exited; not a configured server" in out

    # restarted with process watching off: the saved down alert has no source left; it resolves
    doc = yaml.safe_load(d.cfg.read_text())
    doc["process"] = {"enabled": False}
    d.cfg.write_text(yaml.safe_dump(doc))
    d.start()
    try:
        resolved = wait_for(lambda: [b for b in delivered(slack) if b["text"].startswith("[RESOLVED] ServerDown")],
                            timeout=20, what="the down alert to resolve")
        assert "process watching is off" in json.dumps(resolved[0])
        assert ("specwatch_alerts_firing", (("alertname", "ServerDown"),)) not in _scrape(d.port) or \
            _scrape(d.port)[("specwatch_alerts_firing", (("alertname", "ServerDown"),))] == 0
    finally:
        rc, out = d.stop()
    assert rc == 0, out


def _plain_file_daemon(tmp_path: Path, log: Path, slack):
    """The README's plain file (`server: sglang-0`, one log), quick down/restart timings, to Slack."""
    from specwatch_daemon import SpecwatchDaemon

    return SpecwatchDaemon(tmp_path, log, server="sglang-0", env={"SW_TEST_HOOK": slack.url},
                           rules={"server": {"down_for": "1s", "restart_window": "3s"}},
                           extra={"process": {"interval": "300ms"}},
                           alerts={"group_by": ["..."], "group_wait": "0s", "group_interval": "0s",
                                   "slack": {"webhook_url_env": "SW_TEST_HOOK", "backoff_initial": "0.1s"}})


def test_the_readme_plain_file_setup_alerts_a_crash_and_the_restart(tmp_path, slack, sglang_install, sglang_procs):
    """The README's plain file as written (`server: sglang-0`, one `logs[].path`, no
    process.servers) beside `python -m sglang.launch_server ... 2>&1 | tee -a server.log` run
    through a real shell: `tee` writes the log, yet the server is the log's. Killed, it is down
    (to Slack); started again the same way, the restart is reported and the down alert resolves."""
    log = tmp_path / "server.log"
    port = free_port()
    env = {"FAKE_SGLANG_HTTP": "1"}  # decode lines on its stdout, into the pipe
    sh, pid = sglang_procs.start_teed(server_argv(sglang_install, port, 3, "info"), log, env=env)
    d = _plain_file_daemon(tmp_path, log, slack)
    d.start()
    try:
        srv = (("server", "sglang-0"),)
        wait_for(lambda: _scrape(d.port).get(("specwatch_server_up", srv)) == 1, timeout=20,
                 what="the teed server tied to its log")
        assert ("specwatch_server_up", (("server", f"sglang-0:{port}"),)) not in _scrape(d.port)

        os.kill(pid, signal.SIGKILL)  # a crash
        sh.wait(timeout=10)
        wait_for(lambda: any(t.startswith("[FIRING] ServerDown on sglang-0") for t in texts(slack)),
                 timeout=20, what="the down alert")
        down = next(b for b in delivered(slack) if b["text"].startswith("[FIRING] ServerDown"))
        assert str(pid) in json.dumps(down)  # its last pid in the evidence

        sh, pid2 = sglang_procs.start_teed(server_argv(sglang_install, port, 5, "info"), log, env=env)
        wait_for(lambda: any(t.startswith("[FIRING] ServerRestarted on sglang-0") for t in texts(slack)),
                 timeout=20, what="the restart alert")
        restart = next(b for b in delivered(slack) if b["text"].startswith("[FIRING] ServerRestarted"))
        assert str(pid2) in json.dumps(restart) and "3 → 5" in json.dumps(restart, ensure_ascii=False)
        wait_for(lambda: any(t.startswith("[RESOLVED] ServerDown on sglang-0") for t in texts(slack)),
                 timeout=20, what="the down alert resolved")
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    assert f"sglang-0:{port} (pid {pid}) exited; not a configured server" not in out  # (others' may run on the box)
    assert f"SGLang server pid {pid} writes {log} (through the pipe its output goes to)" in out


def test_a_server_run_by_a_wrapper_script_is_the_log_writer_and_alerts_a_crash_and_the_restart(tmp_path, slack,
                                                                                                sglang_procs):
    """The README's plain file beside `python3 wrapper_server.py 2>&1 | tee -a server.log`: no
    SGLang command line, yet the process writing the log (through tee's pipe) is the log's
    server: up, down when killed (to Slack), restarted when started again."""
    log = tmp_path / "server.log"
    script = Path(__file__).resolve().parent / "data" / "wrapper_server.py"
    sh, pid = sglang_procs.start_teed([sys.executable, str(script)], log, children=0)
    d = _plain_file_daemon(tmp_path, log, slack)
    d.start()
    try:
        srv = (("server", "sglang-0"),)
        wait_for(lambda: _scrape(d.port).get(("specwatch_server_up", srv)) == 1, timeout=20,
                 what="the wrapped server tied to its log")
        os.kill(pid, signal.SIGKILL)
        sh.wait(timeout=10)
        wait_for(lambda: any(t.startswith("[FIRING] ServerDown on sglang-0") for t in texts(slack)),
                 timeout=20, what="the down alert")
        down = next(b for b in delivered(slack) if b["text"].startswith("[FIRING] ServerDown"))
        assert str(pid) in json.dumps(down)
        sh, pid2 = sglang_procs.start_teed([sys.executable, str(script)], log, children=0)
        wait_for(lambda: any(t.startswith("[FIRING] ServerRestarted on sglang-0") for t in texts(slack)),
                 timeout=20, what="the restart alert")
        assert str(pid2) in json.dumps(next(b for b in delivered(slack)
                                            if b["text"].startswith("[FIRING] ServerRestarted")))
        wait_for(lambda: any(t.startswith("[RESOLVED] ServerDown on sglang-0") for t in texts(slack)),
                 timeout=20, what="the down alert resolved")
    finally:
        stop(sh)
        rc, out = d.stop()
    assert rc == 0, out
    assert f"pid {pid} ({sys.executable} {script}) writes {log}: it is sglang-0's server process" in out


def test_a_broken_source_raises_its_own_alert_and_resolves_when_it_reads_again(tmp_path, slack):
    """The daemon's own sources: a log path under a directory that does not exist, a directory
    where the log file should be, a journal directory that does not exist, a /metrics URL and a
    server_api URL on ports nothing listens on. Each raises
    SpecwatchSourceDown (to Slack, and on the status page) after `down_for`, and resolves once
    it is read again."""
    from engine_metrics import EngineMetrics
    from journal_files import JournalDir
    from sglang_http import SGLangHTTP
    from specwatch_daemon import SpecwatchDaemon

    missing = tmp_path / "not-yet" / "server.log"
    folder = tmp_path / "folder.log"
    folder.mkdir()
    closed, api_port = free_port(), free_port()  # bound, never listening: connection refused
    d = SpecwatchDaemon(tmp_path, missing, server="sglang-0", env={"SW_TEST_HOOK": slack.url},
                        rules={"source_down": {"down_for": "1s"}},
                        extra={"process": {"enabled": False},
                               "server_metrics": [{"url": f"http://127.0.0.1:{closed}/metrics", "interval": "1s",
                                                   "timeout": "0.5s", "backoff_max": "1s"}],
                               "server_api": {"url": f"http://127.0.0.1:{api_port}", "interval": "300ms",
                                              "timeout": "200ms", "backoff_max": "600ms"}},
                        alerts={"group_by": ["..."], "group_wait": "0s", "group_interval": "0s",
                                "slack": {"webhook_url_env": "SW_TEST_HOOK", "backoff_initial": "0.1s"}})
    doc = yaml.safe_load(d.cfg.read_text())
    journal = tmp_path / "journal"  # journalctl: "Failed to open ...: No such file or directory"
    doc["logs"] += [{"path": str(folder), "server": "sglang-1"},
                    {"journal": {"unit": "sglang.service", "directory": str(journal)}, "server": "sglang-2"}]
    d.cfg.write_text(yaml.safe_dump(doc))
    d.start()
    engine = api = None
    try:
        firing = lambda: [b for b in delivered(slack) if b["text"].startswith("[FIRING] SpecwatchSourceDown")]  # noqa: E731
        wait_for(lambda: len(firing()) >= 5, timeout=30, what="five source-down alerts")
        bodies = [json.dumps(b) for b in firing()]
        assert len(bodies) == 5
        for where, why in ((str(missing), "does not exist (nor its directory"), (str(folder), "is a directory"),
                           (f"journal:sglang.service@{journal}", "No such file or directory"),
                           (f"http://127.0.0.1:{closed}/metrics", "connection_error"),
                           (f"http://127.0.0.1:{api_port}`", "connection_error")):
            assert sum(where in b and why in b for b in bodies) == 1, (where, bodies)
        with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/api/status", timeout=10) as r:
            status = json.load(r)
        shown = sorted(a["labels"]["source_kind"] for a in status["alerts"] if a["alertname"] == "SpecwatchSourceDown")
        assert shown == ["file", "file", "journal", "server_api", "server_metrics"]
        assert ("specwatch_alerts_firing", (("alertname", "SpecwatchSourceDown"),)) in _scrape(d.port)
        assert _scrape(d.port)[("specwatch_alerts_firing", (("alertname", "SpecwatchSourceDown"),))] == 5

        # the directory appears with the file, the journal is written, the engine serves on that port
        missing.parent.mkdir()
        missing.write_text("")
        JournalDir(journal).append(["INFO:     127.0.0.1:40052 - \"GET /health HTTP/1.1\" 200 OK"])
        engine = EngineMetrics("sglang")
        engine.httpd.shutdown()  # serve on the configured port instead
        engine.httpd.server_close()
        from wsgiref.simple_server import make_server
        engine.httpd = make_server("127.0.0.1", closed, engine.httpd.get_app(), server_class=type(engine.httpd),
                                   handler_class=engine.httpd.RequestHandlerClass)
        threading.Thread(target=engine.httpd.serve_forever, daemon=True).start()
        api = SGLangHTTP("0.5.23", port=api_port)
        resolved = lambda: [b for b in delivered(slack) if b["text"].startswith("[RESOLVED] SpecwatchSourceDown")]  # noqa: E731
        wait_for(lambda: len(resolved()) >= 4, timeout=40, what="the file's, journal's, API's and endpoint's resolved")
        texts_resolved = [json.dumps(b) for b in resolved()]
        assert any(str(missing) in b for b in texts_resolved)
        assert any(f"journal:sglang.service@{journal}" in b for b in texts_resolved)
        assert any(f"source: http://127.0.0.1:{api_port} · kind: server_api" in json.dumps(b, ensure_ascii=False)
                   for b in resolved())
        assert any(f"127.0.0.1:{closed}/metrics" in b for b in texts_resolved)
        assert not any(str(folder) in b for b in texts_resolved)  # still a directory
    finally:
        if engine is not None:
            engine.httpd.shutdown()
        if api is not None:
            api.close()
        rc, out = d.stop()
    assert rc == 0, out


def test_a_server_whose_fds_say_nothing_is_tied_by_the_port_of_its_log_server_args(tmp_path, slack, sglang_install,
                                                                                     sglang_procs):
    """specwatch as a service user cannot read another user's fds; here the server's output goes
    to /dev/null, which ties it to nothing either. The `port` of the log's `server_args` line
    ties it (its --port), also after specwatch restarts past that line: killed, it is down."""
    from sglang_lines import server_args_line
    log = tmp_path / "server.log"
    port = free_port()
    server = sglang_procs.start(server_argv(sglang_install, port, 3, "info"))
    log.write_text(server_args_line(ts="2026-03-01 10:00:00", port=port, speculative_algorithm="EAGLE3")[0] + "\n")
    d = SpecwatchDaemon(tmp_path, log, server="sglang-0", env={"SW_TEST_HOOK": slack.url},
                        rules={"server": {"down_for": "1s"}}, extra={"process": {"interval": "300ms"}},
                        alerts={"group_by": ["..."], "group_wait": "0s", "group_interval": "0s",
                                "slack": {"webhook_url_env": "SW_TEST_HOOK", "backoff_initial": "0.1s"}})
    srv = (("server", "sglang-0"),)
    d.start()
    try:
        wait_for(lambda: _scrape(d.port).get(("specwatch_server_up", srv)) == 1, timeout=20,
                 what="the server tied by its port")
    finally:
        rc, out = d.stop()
    assert rc == 0, out
    assert f"SGLang server pid {server.pid}: tied to sglang-0 by its --port {port}" in out
    d.start()  # resumes after the server_args line: its settings were kept
    try:
        wait_for(lambda: _scrape(d.port).get(("specwatch_server_up", srv)) == 1, timeout=20,
                 what="the server tied again after the restart")
        stop(server)
        wait_for(lambda: any(t.startswith("[FIRING] ServerDown on sglang-0") for t in texts(slack)),
                 timeout=20, what="the down alert")
    finally:
        rc, out = d.stop()
    assert rc == 0, out
