"""`specwatch run` as a real subprocess on a log that gets tracebacks: each reaches Slack once,
classified, with its exception; a traceback cut off mid-way ends by the timeout; the counter
is on /metrics (issue #10 item 7)."""

from __future__ import annotations

import json
import time

from procs import wait_for
from specwatch.sources.log_errors import TIMEOUT
from specwatch_daemon import SpecwatchDaemon

OOM = ["[2026-03-01 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
       '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2790, in run_scheduler_process',
       "    scheduler.event_loop_overlap()",
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB",
       "[2026-03-01 10:00:01] Received sigquit from a child process. It usually means the child failed."]


def test_tracebacks_reach_slack_classified_and_a_cut_one_ends_by_timeout(tmp_path, slack):
    log = tmp_path / "sglang.log"
    log.write_text("")
    d = SpecwatchDaemon(tmp_path, log, env={"SW_TEST_HOOK": slack.url}, alerts={
        "group_wait": "0s", "group_interval": "0s", "slack": {"webhook_url_env": "SW_TEST_HOOK"}})
    d.start()
    with open(log, "a") as f:
        f.write("\n".join(OOM) + "\n")
    wait_for(lambda: len(slack.received) == 1, timeout=20, what="the CUDA OOM message")
    body = json.dumps(slack.received[0], ensure_ascii=False)
    assert "ServerLogError" in slack.received[0]["text"] and "CUDA out of memory" in body
    assert "`torch.OutOfMemoryError: CUDA out of memory." in body  # the exception in a code span
    # a traceback whose writer died after the frames: nothing follows it
    with open(log, "a") as f:
        f.write(OOM[0].replace("TP0", "TP1") + "\n" + OOM[1] + "\n")
    written = time.monotonic()
    wait_for(lambda: len(slack.received) == 2, timeout=20, what="the cut traceback's message")
    assert time.monotonic() - written >= TIMEOUT - 0.5  # it waited for more lines first
    second = json.dumps(slack.received[1], ensure_ascii=False)
    assert "(cut off before the exception line)" in second and "Python error in the log of gpu-box-1 (TP1)" in second
    assert f"`grep -n -A40 Traceback {log}`" in second  # the command with the path, one code span
    m = d.scrape()
    assert m[("specwatch_log_errors_total", (("kind", "cuda_oom"), ("server", "gpu-box-1")))] == 1
    assert m[("specwatch_log_errors_total", (("kind", "other"), ("server", "gpu-box-1")))] == 1
    assert m[("specwatch_alerts_firing", (("alertname", "ServerLogError"),))] == 2
    rc, out = d.stop()
    assert rc == 0 and "alert firing: ServerLogError" in out, out
