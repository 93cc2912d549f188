"""Plain events that flow from sources to metrics and rules.

Sources produce these; nothing here knows about Prometheus, rules or Slack.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Rank tokens SGLang puts in the bracket prefix, as printed (`configure_scheduler_process`,
# sglang/srt/managers/scheduler.py 0.5.23).
RANK_TOKENS = ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP")


@dataclass(frozen=True, slots=True)
class LogLine:
    """One complete line read from a followed file.

    `text` is decoded UTF-8 without the trailing newline; `raw_ok` is False when the bytes were
    not valid UTF-8 (they were decoded with replacement characters).
    `path` is the followed path (not the rotated name), `offset` the byte offset of the line start.
    """

    path: str
    text: str
    offset: int = 0
    raw_ok: bool = True


@dataclass(slots=True)
class BatchLine:
    """Fields shared by decode and prefill lines.

    `timestamp` is seconds since the epoch (the log's local time, converted), `rank` the rank
    tokens exactly as printed (e.g. "DP0 TP0", "" on a single GPU), `ranks` the parsed numbers by
    token name, `fields` every `name: value` pair of the line as text, by name.
    """

    timestamp: float
    rank: str
    ranks: dict[str, int]
    fields: dict[str, str]
    running_requests: int
    queued_requests: int
    token_usage: float | None = None
    graph_enabled: bool | None = None
    graph_kind: str | None = None  # "cuda", "cpu", "npu", "musa"
    forward_iteration: int | None = None


@dataclass(slots=True)
class DecodeBatch(BatchLine):
    """A `Decode batch` line (`report_decode_stats`, sglang/srt/managers/scheduler_components/
    metrics_reporter.py 0.5.23). Rates are per decode-log interval.

    accept_length: tokens per request per verify round, >= 1.0 (1.0 = no draft token accepted).
    accept_rate: version-dependent meaning (accept len ÷ (steps + 1) up to 0.5.5, ÷ draft tokens
    to 0.5.10, accepted drafts ÷ drafts from 0.5.11); never used to decide a collapse.
    gen_throughput: generated tokens per second since the previous decode line.
    """

    accept_length: float | None = None
    accept_rate: float | None = None
    gen_throughput: float | None = None
    num_tokens: int | None = None
    # Which server printed it ("sglang", "vllm": engines/vllm/log.py), and what only some engines say:
    # acceptance rate of draft position 0..k-1 (vLLM `Per-position acceptance rate`, 0.8.5+), and
    # the interval's accepted / drafted token counts.
    engine: str = "sglang"
    position_accept_rates: tuple[float, ...] | None = None
    accepted_tokens: int | None = None
    draft_tokens: int | None = None


@dataclass(slots=True)
class PrefillBatch(BatchLine):
    """A `Prefill batch` line (`report_prefill_stats`, same file as `DecodeBatch`)."""

    new_seq: int | None = None
    new_token: int | None = None
    cached_token: int | None = None
    input_throughput: float | None = None


@dataclass(slots=True)
class ServerArgs:
    """Server settings: from the startup `server_args=ServerArgs(...)` line (`source` "log"),
    `/server_info` ("server_info", resolved values) or the process command line ("cmdline", as
    typed: auto-chosen values are absent).

    Values are kept as Python literals where they parse (int, str, None, bool).
    """

    timestamp: float | None
    args: dict[str, object] = field(default_factory=dict)
    source: str = "log"

    @property
    def speculative_algorithm(self) -> str | None:
        v = self.args.get("speculative_algorithm")
        return str(v) if v is not None else None


@dataclass(frozen=True, slots=True)
class OtherLine:
    """Any line that is not a batch line: request logs, access logs, tracebacks, progress bars."""


@dataclass(frozen=True, slots=True)
class UnrecognizedLine:
    """A line that mentions `Decode batch` but does not start like a record of the log's grammar:
    most likely decode lines in a format specwatch is not told about (a custom logging config).
    Never an indented line, nor one with the words inside a quoted or structured value: those
    continue a multi-line message or quote user text (`sglang_log._other`).
    `text`: the line (cut to 500 characters); `path`: the file it came from ("" when unknown);
    `timestamp`: seconds since the epoch of a `YYYY-MM-DD HH:MM:SS` it starts with, else None."""

    text: str
    path: str = ""
    timestamp: float | None = None


@dataclass(frozen=True, slots=True)
class MalformedLine:
    """A line that starts like a batch line but cannot be read. `reason` says why."""

    reason: str
    timestamp: float | None = None
    rank: str = ""


@dataclass(frozen=True, slots=True)
class LogError:
    """One error from a followed log: a traceback, a burst of torch C++ error lines, or a failed
    health check.

    timestamp: seconds since the epoch (the header's log timestamp when it has one, else the
    clock when its first line was read; None in a replay before any timestamped line). path:
    the followed file. kind: one of `sources.log_errors.KINDS`. exception: the final exception line
    (`RuntimeError: …`), None when the group was cut before it. lines: its last lines (at most
    `sources.log_errors.KEEP_LINES`, each cut at `MAX_LINE_CHARS`); line_count: how many it had. rank: rank tokens
    of the header's SGLang prefix ("TP2"), "" when none. cut: it ended without an exception line.
    engine: "vllm" in a vLLM log (`sources.log_errors.ErrorGrouper.engine`), "" otherwise.
    """

    timestamp: float | None
    path: str
    kind: str
    exception: str | None
    lines: tuple[str, ...]
    line_count: int
    rank: str = ""
    cut: bool = False
    engine: str = ""


# --- events from the process, HTTP API and GPU sources (fed through Pipeline.feed_event) ---


@dataclass(frozen=True, slots=True)
class RoleUsage:
    """Resources of the processes of one role (`main`, `scheduler`, `detokenizer`, ...).

    cpu_seconds: user + system CPU time of the live processes, seconds. rss_bytes: sum of their
    resident set sizes, bytes (pages shared between them are counted once per process).
    """

    processes: int
    cpu_seconds: float
    rss_bytes: int


@dataclass(frozen=True, slots=True)
class ServerProcess:
    """One running SGLang server as seen by psutil: the launcher process and its descendants.

    pid / start_time: the launcher (`python -m sglang.launch_server`, `sglang serve`); start_time
    is seconds since the epoch. args: settings parsed from its command line (field names as in
    SGLang's ServerArgs, values as typed). interpreter: the Python executable as the process
    sees it (a venv's `bin/python`, not the resolved system binary); fs_root: "/" or
    `/proc/<pid>/root` when the server runs in another mount namespace (a container), to be
    prefixed to the paths here. sglang_version / sglang_location: from the `sglang` distribution
    metadata in that interpreter's site-packages (None when not found). output_paths: where
    fd 1 and 2 of the launcher and schedulers point (`/var/log/x.log`, `pipe:[123]`, ...).
    """

    pid: int
    start_time: float
    port: int
    cmdline: tuple[str, ...]
    args: dict[str, object]
    interpreter: str | None
    fs_root: str
    sglang_version: str | None
    sglang_location: str | None
    pids: tuple[int, ...]
    roles: dict[str, RoleUsage]
    output_paths: tuple[str, ...] = ()
    # "sglang" or "vllm" (engines/vllm/settings.py): for vLLM, args are vLLM's settings and
    # sglang_version / sglang_location are those of the `vllm` distribution.
    engine: str = "sglang"

    @property
    def identity(self) -> tuple[int, float]:
        return (self.pid, self.start_time)


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One scan of the process table for one server; `process` None = no such server running.

    expected: a configured server (declared in `process.servers`, or tied to a followed log or
    a `server_api` URL), whose absence is an outage. False: one found on the box and only shown;
    a sample with `process` None and `expected` False says it exited and is forgotten.
    """

    timestamp: float
    process: ServerProcess | None
    expected: bool = True


@dataclass(frozen=True, slots=True)
class ServerStarted:
    """A server process appeared: at specwatch start (`first_seen`) or after it was down."""

    timestamp: float
    process: ServerProcess
    first_seen: bool = False
    previous: ServerProcess | None = None  # the last process seen before it went down


@dataclass(frozen=True, slots=True)
class ServerRestarted:
    """The launcher's pid or start time changed between two scans (a restart between them)."""

    timestamp: float
    old: ServerProcess
    new: ServerProcess


@dataclass(frozen=True, slots=True)
class ServerDown:
    """The server's processes are gone (`last` is what was seen before)."""

    timestamp: float
    last: ServerProcess | None


@dataclass(frozen=True, slots=True)
class DpState:
    """`internal_states[i]` of `/server_info` for DP rank i (scheduler `get_internal_state`).

    avg_spec_accept_length: lifetime accepted tokens / lifetime verify rounds (never the
    per-interval value of the log). last_gen_throughput: tokens/s over the scheduler's last
    decode-log interval; it changes only when an interval completes, which is what tells
    specwatch that decode lines were due (scheduler `log_decode_stats`, 0.4.6.post1-0.5.23).
    """

    dp_rank: int
    avg_spec_accept_length: float | None
    last_gen_throughput: float | None


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What `/server_info` (`/get_server_info` before 0.5.6) and `/model_info` said.

    args: the resolved server args specwatch uses; version: `version`; startup_time: seconds
    since the epoch (0.5.23+, else None); architectures: target `architectures` from
    `/model_info` (0.5.10+, else ()); endpoint: the path that answered.
    """

    version: str | None
    args: dict[str, object]
    dp_states: tuple[DpState, ...]
    startup_time: float | None = None
    architectures: tuple[str, ...] = ()
    endpoint: str = "/server_info"


@dataclass(frozen=True, slots=True)
class ApiSample:
    """One poll of the SGLang HTTP API.

    reachable: an HTTP answer came back (any status). error: why the info call failed
    (`connection_error`, `timeout`, `unauthorized`, `http_503`, `bad_response`, ...), None on
    success. healthy: the last `/health` answer was 200 (None: not asked yet).
    """

    timestamp: float
    url: str
    reachable: bool
    error: str | None
    info: ServerInfo | None = None
    healthy: bool | None = None
    health_status: int | None = None


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU in a GpuSample, read through NVML (sources/nvml.py); values in base units.

    index: NVML index as text (ignores `CUDA_VISIBLE_DEVICES`). up: False when NVML failed on
    the GPU this cycle (lost, unknown error): only labels and xids are then set. listed: NVML
    lists the GPU in the current session; False for an entry that only carries the XIDs seen
    on a GPU no longer listed. A value is None when the GPU lacks that capability.
    reasons: clock event reasons active now (dcgm names); reasons_read: the reason mask was read
    (so the absent ones are known to be inactive). ecc: {"corrected"|"uncorrected": volatile
    count since the driver loaded}. xids: {xid: (count since specwatch started, last time
    seconds since the epoch)}. sglang_memory_bytes: GPU memory held by the SGLang processes
    (None: unknown). energy_joules and pcie_replays are counters since the driver loaded.
    """

    index: str
    uuid: str = ""
    model_name: str = ""
    pci_bus_id: str = ""
    up: bool = True
    listed: bool = True
    reasons: frozenset[str] = frozenset()
    reasons_read: bool = False
    temperature_celsius: float | None = None
    power_watts: float | None = None
    energy_joules: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    pcie_replays: float | None = None
    ecc: dict[str, float] = field(default_factory=dict)
    xids: dict[str, tuple[float, float]] = field(default_factory=dict)
    sglang_memory_bytes: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One NVML sampling cycle (sources/nvml.py `GpuSampler`), GPUs ordered by NVML index.

    timestamp: wall time the cycle ended, seconds since the epoch. up: False when NVML is
    unavailable (then count is None and gpus empty). count: GPUs NVML reports.
    driver: (driver version, CUDA driver API version e.g. "12.8", NVML version), None while
    down. duration_seconds: wall time the cycle took.
    """

    timestamp: float
    up: bool
    count: int | None
    gpus: tuple[GpuState, ...] = ()
    driver: tuple[str, str, str] | None = None
    duration_seconds: float | None = None


ParsedLine = DecodeBatch | PrefillBatch | ServerArgs | OtherLine | MalformedLine | UnrecognizedLine


# --- events from an engine's own Prometheus endpoint (sources/server_metrics.py) ---


@dataclass(frozen=True, slots=True)
class RankMetrics:
    """What one label set of the engine's /metrics said about one rank over one scrape interval.

    rank / ranks: rank tokens built like the log's prefix ("DP1", "" on one GPU) and their numbers
    (`DP`, `TP`, `PP`; absent = 0). accept_length: tokens per verify round, >= 1.0; None when the
    interval had no drafts (nothing to judge). accept_rate: accepted ÷ proposed draft tokens, 0-1.
    running_requests: the engine's running-requests gauge (None: not exported). fresh: the values
    describe decoding since the previous scrape (an SGLang gauge that did not move is stale).
    drafts / draft_tokens / accepted_tokens: counter increases over the interval (vLLM; None for
    SGLang's gauges). position_accept_rates: accepted ÷ drafts per draft position 0, 1, ... (vLLM).
    """

    rank: str
    ranks: dict[str, int]
    accept_length: float | None
    accept_rate: float | None = None
    running_requests: int | None = None
    queued_requests: int | None = None
    gen_throughput: float | None = None
    fresh: bool = True
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    position_accept_rates: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """One scrape of an engine's /metrics (`server_metrics[]`).

    timestamp: wall time of the scrape, seconds since the epoch. engine: "sglang" or "vllm", told
    from the metric names (None: neither's speculative families were found). error: why the scrape
    failed (`connection_error`, `timeout`, `http_<status>`, `bad_response`), None on success.
    ranks: one entry per label set. resets: counters that went backwards in this interval (the
    engine restarted; vLLM).
    """

    timestamp: float
    url: str
    engine: str | None
    error: str | None = None
    ranks: tuple[RankMetrics, ...] = ()
    resets: int = 0


# --- specwatch's own log sources (sources/log_health.py) ---


@dataclass(frozen=True, slots=True)
class SourceHealth:
    """A followed log source's state changed (and its first state, at start-up).

    timestamp: seconds since the epoch. kind: "file" or "journal". name: the followed path (a
    journal's `journal:` key). ok: the file is open / journalctl runs and reads. state: what is
    wrong in words ("does not exist", "is a directory", "cannot be read: [Errno 13] ...", the
    journalctl error), "" when ok.
    """

    timestamp: float
    kind: str
    name: str
    ok: bool
    state: str = ""
