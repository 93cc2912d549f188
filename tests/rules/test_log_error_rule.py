"""ServerLogError through the real pipeline: a recorded log read by the real Follower
(`replay_files`, the batch path the daemon uses), the error stage, the rule, the metrics as
Prometheus parses them, and the Slack payload."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from sglang_lines import decode_line, server_args_line  # noqa: E402
from test_hostile_paths import HOSTILE, _check_slack_text, _mrkdwn_texts  # noqa: E402

from specwatch.alerts.dispatcher import Dispatcher  # noqa: E402
from specwatch.config import build_config  # noqa: E402
from specwatch.core.metrics import PipelineCollector  # noqa: E402
from specwatch.notifiers.slack import build_payload  # noqa: E402
from specwatch.core.pipeline import Pipeline  # noqa: E402
from specwatch.replay import replay_files  # noqa: E402
from specwatch.core.events import LogError  # noqa: E402
from specwatch.rules.log_errors import ALERT_NAME, fixes_for  # noqa: E402
from specwatch.sources.log_errors import KINDS  # noqa: E402

V = "0.5.23"
SHAPE = "RuntimeError: The size of tensor a (8640) must match the size of tensor b (5760) at non-singleton dimension 1"


def tb(ts: str, exception: str, head: str = "Scheduler hit an exception: ", rank: str = " TP0") -> list[str]:
    return [f"[{ts}{rank}] {head}Traceback (most recent call last):",
            '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2790, in run_scheduler_process',
            "    scheduler.event_loop_overlap()",
            exception]


def decode(ts: str) -> str:
    return decode_line(V, ts=ts, accept_len=2.8, running=4)[0]


def replay(tmp_path: Path, lines: list[str], rules: dict | None = None) -> Pipeline:
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    cfg = build_config({"server": "box", "logs": [{"path": str(log)}], "rules": rules or {}})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True))
    replay_files(p, [str(log)], 1 << 20)
    return p


def scrape(p: Pipeline) -> dict:
    reg = CollectorRegistry()
    reg.register(PipelineCollector(p))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(generate_latest(reg).decode()) for s in f.samples}


def test_each_kind_fires_once_with_its_severity_lines_and_fix(tmp_path):
    lines = [server_args_line(ts="2026-03-01 09:59:00", speculative_algorithm="EAGLE3")[0], decode("2026-03-01 10:00:00")]
    lines += tb("2026-03-01 10:00:05", SHAPE, "Initialization failed. warmup error: ", rank="")
    lines += tb("2026-03-01 10:00:06", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    lines += ["[rank1]:[E1205 17:08:49.1 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
              "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 600031 milliseconds before timing out."]
    lines += tb("2026-03-01 10:00:08", "KeyError: 'x'", rank=" TP1")
    lines += tb("2026-03-01 10:00:09", "KeyError: 'y'", rank=" TP1")  # the same kind again
    lines.append(decode("2026-03-01 10:00:10"))
    p = replay(tmp_path, lines)
    fired = [(a.labels["kind"], a.labels["severity"], a.status) for a in p.dispatcher.history if a.name == ALERT_NAME]
    assert fired == [("shape_mismatch", "critical", "firing"), ("cuda_oom", "critical", "firing"),
                     ("nccl_timeout", "critical", "firing"), ("other", "warning", "firing")]
    shape, oom, nccl, other = [a for a in p.dispatcher.history if a.name == ALERT_NAME]
    assert {a.labels["engine"] for a in (shape, oom, nccl, other)} == {"sglang"}
    ev = dict(shape.evidence)
    assert ev["exception"] == SHAPE and ev["kind"] == "shape_mismatch" and ev["log"] == str(tmp_path / "server.log")
    assert ev["last lines"].splitlines() == tb("2026-03-01 10:00:05", SHAPE, "Initialization failed. warmup error: ", rank="")
    assert "8640 = 3 × 2880 and 5760 = 2 × 2880" in shape.fixes[0]
    assert "--mem-fraction-static" in oom.fixes[0] and dict(oom.evidence)["rank"] == "TP0"
    assert "the first traceback of another rank" in nccl.fixes[0]
    assert dict(other.evidence)["exception"] == "KeyError: 'x'"
    [rule] = [r for r in p.rules if r.name == "log_errors"]
    live = dict(rule.active.get("box|other").evidence)  # the firing alert shows the newest error
    assert live["errors of this kind"] == "2" and live["exception"] == "KeyError: 'y'"
    m = scrape(p)
    counts = {k[1][0][1]: v for k, v in m.items() if k[0] == "specwatch_log_errors_total"}
    assert {k: v for k, v in counts.items() if v} == {"cuda_oom": 1, "nccl_timeout": 1, "shape_mismatch": 1, "other": 2}
    assert set(counts) == set(KINDS)  # every kind is on /metrics, 0 while none came
    # the lines are still counted as lines
    assert m[("specwatch_log_lines_total", (("kind", "other"), ("server", "box")))] == len(lines) - 2  # all but the 2 decode lines, as before


def test_resolves_after_quiet_time_and_a_cut_traceback_at_the_end_still_counts(tmp_path):
    lines = [decode("2026-03-01 10:00:00")] + tb("2026-03-01 10:00:01", "KeyError: 'x'")
    lines += [decode(f"2026-03-01 10:{m:02d}:00") for m in range(1, 4)]
    lines += tb("2026-03-01 10:03:30", "KeyError: 'z'")[:2]  # the file ends inside a traceback
    p = replay(tmp_path, lines, {"log_errors": {"resolve_after": "2m"}})
    assert [(a.status, dict(a.evidence)["exception"]) for a in p.dispatcher.history] == [
        ("firing", "KeyError: 'x'"), ("resolved", "KeyError: 'x'"), ("firing", "(cut off before the exception line)")]
    assert p.servers["box"].errors["other"] == 2


def test_container_prefixed_traceback_and_disabled_rule(tmp_path):
    lines = ["sglang-1  | " + line for line in tb("2026-03-01 10:00:01", SHAPE)] + ["sglang-1  | " + decode("2026-03-01 10:00:02")]
    p = replay(tmp_path, lines)
    [a] = p.dispatcher.history
    assert a.labels["kind"] == "shape_mismatch" and dict(a.evidence)["exception"] == SHAPE
    p = replay(tmp_path, lines, {"log_errors": {"enabled": False}})
    assert p.dispatcher.history == [] and p.servers["box"].errors["shape_mismatch"] == 1


def test_log_text_reaches_slack_escaped(tmp_path):
    hostile = f"ValueError: bad draft {HOSTILE}"
    p = replay(tmp_path, tb("2026-03-01 10:00:01", hostile) + [decode("2026-03-01 10:00:02")])
    [a] = p.dispatcher.history
    payload = build_payload(a)
    spans = [s for t in _mrkdwn_texts(payload) for s in _check_slack_text(t)]
    assert any("bad draft my draft;$(touch pwned)" in s for s in spans)  # the exception, in a code span


def test_commands_in_fixes_quote_the_log_path():
    from specwatch.alerts.model import split_code
    from specwatch.core.events import LogError
    from specwatch.rules.log_errors import fixes_for

    e = LogError(None, "/var/log/my log;$(touch x).log", "other", "KeyError: '`x`'", (), 1)
    spans = [part for f in fixes_for("other", e) + fixes_for("nccl_timeout", e) for c, part in split_code(f) if c]
    assert "grep -n -A40 Traceback '/var/log/my log;$(touch x).log'" in spans
    assert "grep -n -B2 -A30 Traceback '/var/log/my log;$(touch x).log'" in spans
    assert "KeyError: '`x`'" in spans  # log text in its own span, backticks and all


def test_a_vllm_traceback_is_stamped_with_its_year_and_advised_for_vllm(tmp_path):
    """BR-04 replayed: the alert starts at the header's time (not 1970), and its fixes name
    vLLM's engine-config line, not SGLang's `server_args`."""
    br04 = (Path(__file__).resolve().parents[1] / "data" / "samples" / "bugreport-logs" / "BR-04.log")
    p = replay(tmp_path, br04.read_text().splitlines())
    a, refused = p.dispatcher.history
    # named for what happened (once `SGLangLogError` on a vLLM server), the engine a label
    assert [(x.name, x.labels["engine"]) for x in (a, refused)] == [("ServerLogError", "vllm")] * 2
    # the second report's `NotImplementedError: EAGLE does not support TP > 1 yet`: a refusal at start-up
    assert (refused.labels["kind"], refused.labels["severity"]) == ("unsupported", "critical")
    assert (a.labels["kind"], a.labels["severity"]) == ("other", "critical")  # no batch line yet: at start-up
    assert a.starts_at > 1e9 and time.localtime(a.starts_at)[1:6] == (12, 16, 5, 3, 28)
    assert any("engine-config line" in f for f in a.fixes) and not any("server_args" in f for f in a.fixes)
    oom = LogError(None, "x.log", "cuda_oom", None, (), 1, engine="vllm")
    assert "`--gpu-memory-utilization`" in fixes_for("cuda_oom", oom)[0]
    assert "`--mem-fraction-static`" in fixes_for("cuda_oom", replace(oom, engine=""))[0]


def test_no_line_counts_for_the_host_name_server_no_source_uses(tmp_path):
    """Every log names its own server: the default `server` (GPU alerts carry it) has no
    specwatch_log_lines_total series of zeros; the log's server has all kinds."""
    log = tmp_path / "server.log"
    log.write_text(decode("2026-03-01 10:00:00") + "\n")
    cfg = build_config({"server": "host-1", "logs": [{"path": str(log), "server": "sglang-a"}]})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0))
    p._stats("host-1")  # as the daemon's GPU and process samples create it
    replay_files(p, [str(log)], 1 << 20)
    servers = {dict(k)["server"] for (name, k) in scrape(p) if name == "specwatch_log_lines_total"}
    assert servers == {"sglang-a"}
    assert scrape(p)[("specwatch_log_lines_total", (("kind", "decode"), ("server", "sglang-a")))] == 1


BR = Path(__file__).resolve().parents[1] / "data" / "samples" / "bugreport-logs"


def test_br45_hung_schedulers_page_by_the_watchdog_line_naming_the_settings_and_the_crash(tmp_path):
    """BR-45 (sgl-project/sglang#29144): EAGLE + DP attention, every DP scheduler's watchdog fires
    after 300 s with /health at 200; one critical alert at the first watchdog line, with every
    rank and the launcher's crash line in its evidence, the settings and the workaround."""
    lines = BR.joinpath("BR-45.log").read_text().splitlines()
    p = replay(tmp_path, lines)
    [a] = [x for x in p.dispatcher.history if x.name == ALERT_NAME]
    assert (a.labels["kind"], a.labels["severity"], a.status) == ("watchdog_timeout", "critical", "firing")
    assert time.localtime(a.starts_at)[:6] == (2026, 6, 24, 8, 13, 0)  # the watchdog line, not later
    assert "EAGLE + DP attention" in a.annotations["summary"]
    [rule] = [r for r in p.rules if r.name == "log_errors"]
    ev = dict(rule.active.get("box|watchdog_timeout").evidence)  # the firing alert, as the status page shows it
    assert ev["ranks"] == ", ".join([f"DP{i} TP{i} EP{i}" for i in range(8)] + ["scheduler_0 crashed (exit code -3)"])
    assert ev["speculative_algorithm"] == "EAGLE" and ev["enable_dp_attention"] == "True" and ev["dp_size"] == "8"
    assert "sgl-project/sglang#29144" in a.fixes[0] and "drop `--speculative-algorithm`" in a.fixes[0]
    assert scrape(p)[("specwatch_log_errors_total", (("kind", "subprocess_crash"), ("server", "box")))] == 1


def test_a_subprocess_crash_alone_is_critical_with_its_signal():
    from specwatch.rules.log_errors import fixes_for as fx
    e = LogError(None, "s.log", "subprocess_crash",
                 "[2026-04-25 02:01:26] Subprocess scheduler_0 (pid=7391) crashed with exit code -11. Triggering SIGQUIT for cleanup...",
                 (), 1)
    assert "SIGSEGV" in fx("subprocess_crash", e)[0]


def test_br47_crash_loop_counts_three_failed_starts_with_the_specific_fix(tmp_path):
    """BR-47 (sgl-project/sglang#32105): draft CUDA graph capture fails at each of three starts
    with the same settings: one critical alert, `failed starts with these settings` 3, the fix
    naming `--enable-expert-distribution-metrics` and `--speculative-num-steps 1`."""
    p = replay(tmp_path, BR.joinpath("BR-47.log").read_text().splitlines())
    [a] = [x for x in p.dispatcher.history if x.name == ALERT_NAME]
    assert (a.labels["kind"], a.labels["severity"]) == ("cuda_graph", "critical")
    [rule] = [r for r in p.rules if r.name == "log_errors"]
    a = rule.active.get("box|cuda_graph")
    ev = dict(a.evidence)
    assert ev["failed starts with these settings"] == "3" and ev["errors of this kind"] == "3"
    assert "crash loop: 3 failed starts" in a.annotations["summary"]
    # the 2nd and 3rd failed starts are updates of the one alert: a receiver hears of each
    class Receiver:
        name, send_resolved = "rec", True

        def __init__(self):
            self.got = []

        def notify(self, n):
            self.got += [(a.labels.get("kind"), a.annotations.get("update")) for a in n.alerts]

    rec = Receiver()
    log = tmp_path / "loop.log"
    log.write_text(BR.joinpath("BR-47.log").read_text())
    p = Pipeline(build_config({"server": "box", "logs": [{"path": str(log)}]}),
                 Dispatcher([rec], group_wait=0, group_interval=0, keep_history=True))
    replay_files(p, [str(log)], 1 << 20)
    assert rec.got == [("cuda_graph", None), ("cuda_graph", "crash loop: 2 failed starts with the same settings"),
                       ("cuda_graph", "crash loop: 3 failed starts with the same settings")]
    assert "--enable-expert-distribution-metrics" in a.fixes[0] and "--speculative-num-steps 1" in a.fixes[0]
    assert any("--disable-cuda-graph" in f for f in a.fixes)
    # a start with other settings starts the count again
    lines = BR.joinpath("BR-47.log").read_text().splitlines()
    at = [i for i, t in enumerate(lines) if "server_args=" in t][2]
    lines[at] = lines[at].replace("speculative_num_steps=3", "speculative_num_steps=2")
    p = replay(tmp_path, lines)
    [rule] = [r for r in p.rules if r.name == "log_errors"]
    assert dict(rule.active.get("box|cuda_graph").evidence)["failed starts with these settings"] == "1"


def test_br49_vllm_that_refuses_to_start_is_an_error_with_the_dp_fix(tmp_path):
    p = replay(tmp_path, BR.joinpath("BR-49.log").read_text().splitlines())
    [a] = [x for x in p.dispatcher.history if x.name == ALERT_NAME]
    assert (a.labels["kind"], a.labels["severity"]) == ("unsupported", "critical")
    assert "NotImplementedError: Prometheus metrics with Spec Decoding" in dict(a.evidence)["exception"]
    assert "--data-parallel-size 1" in a.fixes[0] and "vllm-project/vllm#24049" in a.fixes[0]
    assert dict(a.evidence)["when"].startswith("at start-up")


def test_an_unknown_traceback_at_start_up_is_an_error_and_after_serving_a_warning(tmp_path):
    start = [server_args_line(ts="2026-03-01 09:59:00", speculative_algorithm="EAGLE3")[0]]
    p = replay(tmp_path, start + tb("2026-03-01 10:00:05", "KeyError: 'x'"))
    [a] = p.dispatcher.history
    assert a.labels["severity"] == "critical" and "not serving" in a.annotations["description"]
    p = replay(tmp_path, start + [decode("2026-03-01 10:00:00")] + tb("2026-03-01 10:00:05", "KeyError: 'x'"))
    [a] = p.dispatcher.history
    assert a.labels["severity"] == "warning" and "when" not in dict(a.evidence)


def test_a_device_side_assert_names_the_poisoned_rank_before_the_nccl_timeouts(tmp_path):
    lines = [decode("2026-03-01 10:00:00")]
    lines += ["[2026-03-01 10:00:01 TP3] Scheduler hit an exception: Traceback (most recent call last):",
              '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2790, in run_scheduler_process',
              "    scheduler.event_loop_overlap()",
              "RuntimeError: CUDA error: device-side assert triggered"]
    lines += ["[rank1]:[E301 10:10:01.1 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
              "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) ran for 600031 milliseconds before timing out."]
    p = replay(tmp_path, lines + [decode("2026-03-01 10:10:02")])
    errors = [a for a in p.dispatcher.history if a.name == ALERT_NAME]
    kinds = [(a.labels["kind"], a.labels["severity"], dict(a.evidence).get("rank")) for a in errors]
    assert kinds == [("device_assert", "critical", "TP3"), ("nccl_timeout", "critical", "rank1")]
    assert "The rank with the assert is the cause" in errors[0].fixes[0]
    assert dict(errors[1].evidence)["caused by"].startswith("the device-side assert on TP3 at 2026-03-01T")
    assert errors[1].fixes[0].startswith("The device-side assert on TP3 came first")
    assert time.localtime(errors[1].starts_at)[:5] == (2026, 3, 1, 10, 10)  # March 1, not 1970


def test_a_traceback_while_vllm_stops_is_not_a_page(tmp_path):
    """The real vLLM CPU server's SIGTERM ends in `AsyncLLM output_handler failed.` + EngineDeadError."""
    lines = (Path(__file__).resolve().parents[1] / "data" / "samples" / "vllm-cpu" / "eagle3.log").read_text().splitlines()
    p = replay(tmp_path, lines)
    assert [a for a in p.dispatcher.history if a.name == ALERT_NAME] == []
    assert p.servers["box"].errors["shutdown"] == 1
