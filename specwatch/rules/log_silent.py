"""The log went silent while the server is up and decoding: specwatch is blind.

SGLang's scheduler sets `last_gen_throughput` in the same function that prints the `Decode batch`
line, once per `--decode-log-interval` decode rounds (`log_decode_stats`, scheduler.py
0.4.6.post1 .. metrics_reporter.py 0.5.23), and `/server_info` reports it per DP rank. So a poll
in which it changed proves a decode line was due. `SGLangLogSilent` (warning) fires when
`intervals` polls in a row saw a new interval completed but no decode line reached specwatch
for that server, while its process runs. It resolves at the next decode line (or when the
server stops: that is the down alert's business).

The fix depends on why, and the evidence says which: `--log-level warning` (or higher) drops
the INFO decode lines; the server writes somewhere else than the followed file (its fd 1/2
targets, from the process source); or the followed file does not exist any more (moved).
Servers without a followed log, and prefill-only disaggregated servers, are never checked.
"""

from __future__ import annotations

import os
from collections import defaultdict
from typing import TYPE_CHECKING, Callable

from specwatch.alerts.model import Alert, code, iso8601
from specwatch.core.sections import Count, Section, rule_section
from specwatch.core.events import (
    ApiSample,
    ProcessSample,
    ServerArgs,
    ServerInfo,
    ServerProcess,
    ServerRestarted,
    ServerStarted,
)
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import RuleContext, log_paths_of, register
from specwatch.rules.fileorder import first_and_last
from specwatch.rules.summary import CLOCK

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("log_silent")
class LogSilentConfig(Section):
    intervals: Count = 3  # decode-log intervals seen through /server_info without a decode line


ALERT_NAME = "SGLangLogSilent"
QUIET_LEVELS = ("warning", "error", "critical")


class _State:
    __slots__ = ("last_decode", "intervals", "throughput", "args", "process", "watched", "first_poll")

    def __init__(self) -> None:
        self.last_decode: float | None = None
        self.intervals = 0
        self.throughput: dict[int, float | None] = {}
        self.args: dict = {}
        self.process: ServerProcess | None = None
        self.watched = False
        self.first_poll: float | None = None


def _codes(values: list[str]) -> str:
    """Paths from the server or the config in the text: each a code span."""
    return ", ".join(code(v) for v in values)


@register
class LogSilentRule(ActiveAlertsRule):
    """log_paths: server → followed log files. path_exists: checked when the alert fires.
    last_lines: `RuleContext.last_lines`."""

    name = "log_silent"
    alert_names = (ALERT_NAME,)
    order = 20

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "LogSilentRule":
        return cls(config.log_silent, ctx.log_paths, last_lines=ctx.last_lines)

    def __init__(self, config: LogSilentConfig, log_paths: dict[str, list[str]],
                 path_exists: Callable[[str], bool] = os.path.exists,
                 last_lines: Callable[[str], dict[str, float]] | None = None):
        super().__init__()
        self.config = config
        self.log_paths = log_paths
        self.path_exists = path_exists
        self.last_lines = last_lines  # server → {line kind: clock of its last line} (the pipeline's)
        self._s: defaultdict[str, _State] = defaultdict(_State)  # server → state, made on first use

    def reconfigure(self, config: Config) -> None:
        self.config = config.log_silent
        self.log_paths = log_paths_of(config)

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The server's decode lines since the last evaluation: the last one in file order is
        the last decode line (its clock: the pipeline's `last_lines(server)["decode"]`, the same
        line, without reading the ranks); the first one resolves the alert at its clock, as it
        would have read alone. Prefill lines change nothing here."""
        for rs in ranks:
            if rs.pending:
                break
        else:
            return []  # prefill lines only
        st = self._s[server]
        last = self.last_lines(server).get("decode") if self.last_lines is not None else None
        if last is None:
            ends = first_and_last(ranks)
            assert ends is not None  # a rank has pending decode lines (above)
            last = ends[3][CLOCK]
        st.last_decode = last
        st.intervals = 0
        if server not in self.active:
            return []  # the common case
        ends = first_and_last(ranks)
        assert ends is not None
        return self.active.resolve(server, ends[1][CLOCK], ("decode lines", "arriving again"))

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if isinstance(event, ServerArgs):
            self._s[server].args = dict(event.args)
        elif isinstance(event, ProcessSample):
            st = self._s[server]
            st.watched = True
            st.process = event.process
            if event.process is None:
                st.intervals = 0
                st.throughput.clear()
                return self.active.resolve(server, now, ("server", "stopped"))
        elif isinstance(event, (ServerRestarted, ServerStarted)):
            st = self._s[server]
            st.throughput.clear()  # a new scheduler starts its counters again
            st.intervals = 0
        elif isinstance(event, ApiSample) and event.info is not None:
            return self._poll(server, event.info, now)
        return []

    def _poll(self, server: str, info: ServerInfo, now: float) -> list[Alert]:
        st = self._s[server]
        if st.first_poll is None:
            st.first_poll = now
        advanced = False
        for dp in info.dp_states:
            prev = st.throughput.get(dp.dp_rank)
            if dp.dp_rank in st.throughput and dp.last_gen_throughput is not None and dp.last_gen_throughput != prev:
                advanced = True
            st.throughput[dp.dp_rank] = dp.last_gen_throughput
        if not advanced or not self.log_paths.get(server):
            return []
        args = {**info.args, **st.args}  # st.args: the pipeline's merge of every source
        if str(args.get("disaggregation_mode") or "null").lower() == "prefill":
            return []  # a prefill server prints no decode lines
        if st.watched and st.process is None:
            return []
        st.intervals += 1
        if st.intervals >= self.config.intervals and server not in self.active:
            return self.active.fire(server, self._alert(server, st, args, now))
        return []

    def _alert(self, server: str, st: _State, args: dict, now: float) -> Alert:
        followed = self.log_paths.get(server, [])
        level = str(args.get("log_level") or "info").lower()
        interval = args.get("decode_log_interval") or 40
        outputs = list(st.process.output_paths) if st.process else []
        in_container = bool(st.process and st.process.fs_root != "/")
        missing = [p for p in followed if not self.path_exists(p)]
        files = [o for o in outputs if o.startswith("/") and not o.startswith("/dev/")]
        evidence = [
            ("decode-log intervals without a decode line", f">= {st.intervals}"),
            ("last decode line", iso8601(st.last_decode) or f"none since {iso8601(st.first_poll)}"),
            ("decode_log_interval", str(interval)),
            ("log_level", level),
            ("followed", ", ".join(followed)),
        ]
        if outputs:
            evidence.append(("SGLang writes to (fd 1/2)", ", ".join(outputs)))
        if missing:
            evidence.append(("missing", ", ".join(missing)))
        fixes: list[str] = []
        cause = "unknown"
        if level in QUIET_LEVELS:
            cause = f"--log-level {level}"
            fixes.append(
                f"SGLang runs with `--log-level {level}`: the `Decode batch` lines are INFO and are "
                "dropped. Restart it with `--log-level info` (the default), or remove the flag.")
        if files and not in_container and not set(files) & set(followed):
            cause = cause if cause != "unknown" else "wrong file followed"
            fixes.append(
                f"SGLang writes to {_codes(files)}, specwatch follows {_codes(followed)}: set "
                f"`logs[].path` to {code(files[-1])} (and restart specwatch).")
        if missing:
            cause = cause if cause != "unknown" else "log moved"
            fixes.append(
                f"{_codes(missing)} does not exist any more: the log was moved or deleted and "
                "nothing recreated it. Find where SGLang writes now"
                + (f" (`ls -l /proc/{st.process.pid}/fd/1 /proc/{st.process.pid}/fd/2`)" if st.process else "")
                + " and point `logs[].path` there, or fix the rotation (copytruncate or a reopen signal).")
        pipes = [o for o in outputs if o.startswith(("pipe:", "socket:"))]
        if pipes and not fixes:
            fixes.append(
                f"SGLang's output goes to {_codes(pipes)} (`| tee`, a process manager or journald): "
                "point `logs[].path` at the file that pipe ends in, e.g. the `tee -a` target.")
        fixes.append(
            "Otherwise: check `SGLANG_LOGGING_CONFIG_PATH` in the server's environment (a logging "
            "config can route or drop the scheduler's INFO lines), and `tail -F` the followed file "
            "while requests run.")
        evidence.insert(0, ("likely cause", cause))
        return Alert(
            labels={"alertname": ALERT_NAME, "severity": "warning", "server": server, "rank": ""},
            annotations={
                "summary": f"No decode lines from {server} while it is decoding ({cause})",
                "description": (
                    f"/server_info shows the scheduler finished {st.intervals} decode-log intervals "
                    f"({interval} decode rounds each) with no `Decode batch` line reaching specwatch. "
                    "Accept length, throughput and collapse detection are blind until it is fixed."
                ),
            },
            starts_at=now,
            evidence=evidence,
            fixes=fixes,
        )
