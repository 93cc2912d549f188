"""Speculation inactive: the server is configured to speculate, but its decode lines say it does not.

SGLang prints `accept len` on every decode line when a speculative algorithm runs
(`report_decode_stats`, sglang/srt/managers/scheduler_components/metrics_reporter.py 0.5.23). A
server whose settings (`ServerArgs.speculative_algorithm`, from the startup `server_args` line or
any other source that sends `ServerArgs` events) name an algorithm but whose decode lines carry no
accept fields is not drafting at all: no draft cost, no speedup. This is not a collapse (drafts
made, all rejected) and must not be reported as a bad draft (BR-14, docs/bugreports.md). Per server:
fires after `min_batches` decode lines with requests running and no accept fields; resolves on the
first decode line with them, or when new settings name no algorithm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specwatch.alerts.model import Alert
from specwatch.core.sections import Count, Section, rule_section
from specwatch.core.events import DecodeBatch, ServerArgs
from specwatch.rules.active import ActiveAlerts
from specwatch.rules.base import Rule, ServerArgsMemory, args_evidence, new_alert, register, speculation_configured
from specwatch.rules.fileorder import in_file_order
from specwatch.rules.summary import ACCEPT, RUNNING, SEQ, TS

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("speculation_inactive")
class SpeculationInactiveConfig(Section):
    enabled: bool = True
    min_batches: Count = 3


ALERT_NAME = "SpeculationInactive"


def _plain_line(pending: list[tuple]) -> bool:
    """Whether a rank's pending decode lines hold one without accept fields (requests running)."""
    for e in pending:
        if e[ACCEPT] is None and e[RUNNING] > 0:
            return True
    return False


@register
class SpeculationInactiveRule(Rule):
    name = "speculation_inactive"
    alert_names = (ALERT_NAME,)
    order = 70

    def __init__(self, config: SpeculationInactiveConfig):
        self.config = config
        self.args = ServerArgsMemory()
        self._plain: dict[str, int] = {}  # server → decode lines without accept fields in a row
        self._since: dict[str, float] = {}
        self.active = ActiveAlerts()  # by server

    def reconfigure(self, config: Config) -> None:
        self.config = config.speculation_inactive

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if not self.config.enabled or not isinstance(event, ServerArgs):
            return []
        self.args.observe(server, event)
        self._plain.pop(server, None)
        if not speculation_configured(event.args):
            return self.active.resolve(server, event.timestamp or now, ("speculative_algorithm", "none (settings changed)"))
        return []

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The server's decode lines since the last evaluation, those with requests running, in
        file order across ranks (`seq`): a run of lines without accept fields counts up (and
        fires at the line that reaches `min_batches`), a line with them ends the run (and
        resolves the alert at its timestamp). Exact, as line by line: the settings cannot change
        within an evaluation (a `ServerArgs` event ends it). The common cases read no line twice:
        every line drafted and nothing counting or firing (nothing to do), or no draft configured
        and nothing firing (the lines count nothing)."""
        cfg = self.config
        if not cfg.enabled:
            return []
        args = self.args.get(server)
        configured = speculation_configured(args)
        watching = server in self._plain or server in self.active  # a drafted line changes something
        if not configured:
            if not watching:
                return []
        elif not any(_plain_line(rs.pending) for rs in ranks):
            if not watching:
                return []  # the common case
            first = None  # no run to count: only the first drafted line (with requests) matters
            for rs in ranks:
                e = next((e for e in rs.pending if e[RUNNING] > 0), None)
                if e is not None and (first is None or e[SEQ] < first[1][SEQ]):
                    first = (rs, e)
            if first is not None:
                self._drafted(server, first[1], emit)
            return []
        n = self._plain.get(server, 0)
        run: list[tuple] = []  # the lines without accept fields since the last one with them
        spec_args = args or {}  # a run is counted only when configured: args were seen
        for rs, e in in_file_order(ranks):
            if e[RUNNING] <= 0:
                continue
            if e[ACCEPT] is None:
                if configured:
                    run.append((rs, e))
                continue
            if run:
                self._count(server, spec_args, n, run, emit)
                run = []
            n = 0
            self._drafted(server, e, emit)
        if run:
            self._count(server, spec_args, n, run, emit)
            n += len(run)
        if n:
            self._plain[server] = n
        return []

    def _drafted(self, server: str, e: tuple, emit) -> None:
        """A decode line with accept fields and requests running: the run ends, the alert
        resolves at it."""
        self._plain.pop(server, None)
        if server in self.active:
            emit(self.active.resolve(server, e[TS], ("accept len", f"{e[ACCEPT]:.2f}")), e)

    def _count(self, server: str, args: dict, n: int, run: list[tuple], emit) -> None:
        """A run of decode lines without accept fields, after `n` such lines: the first one starts
        the count when n is 0; the line that makes it `min_batches` fires."""
        if not n:
            self._since[server] = run[0][1][TS]
        k = max(0, self.config.min_batches - n - 1)  # the line of the run that reaches min_batches
        if k >= len(run) or server in self.active:
            return
        rs, e = run[k]
        emit(self.active.fire(server, self._alert(server, rs.batch(e), args, n + k + 1)), e)

    def _alert(self, server: str, b: DecodeBatch, args: dict, n: int) -> Alert:
        algo = args.get("speculative_algorithm")
        return new_alert(
            ALERT_NAME, "warning", server, "",
            summary=f"Speculative decoding configured ({algo}) but not running on {server}: decode lines have no accept len",
            description=(
                f"The server's settings name speculative algorithm {algo}, but {n} decode lines in a row with "
                "requests running carry no `accept len` / `accept rate`: SGLang prints them whenever a draft "
                "runs. The server decodes without drafting: no speedup, and no acceptance to monitor. This "
                "is not an acceptance collapse."
            ),
            starts_at=self._since.get(server, b.timestamp),
            evidence=[("decode lines without accept fields", str(n)), ("last decode line rank", b.rank or "(single)"),
                      ("running requests", str(b.running_requests)),
                      ("gen throughput (token/s)", "n/a" if b.gen_throughput is None else f"{b.gen_throughput:.2f}")]
                     + args_evidence(args),
            fixes=[
                "Check what the running server uses: `curl -s localhost:30000/server_info | python3 -m json.tool "
                "| grep -E 'speculative|version'` (port: --port). A server restarted without the "
                "`--speculative-*` flags still shows the old settings line in a log that was not rotated.",
                "Check that the log holds only this server's lines: another SGLang process (a second "
                "server, an old instance) writing to the same file mixes decode lines; compare the rank "
                "prefixes and `grep -n 'server_args=' <log>`.",
                "Look for a fallback at startup: `grep -n -i -E 'specul|draft|eagle' <log> | head -50`; "
                "a draft that failed to load or an unsupported combination (e.g. attention backend) can "
                "disable speculation with only a warning.",
                "A log collector or filter that rewrites lines can drop fields: compare one decode line in "
                "the raw output of the process (`journalctl -u <unit>` or `docker logs`) with the file.",
            ],
        )

    def to_state(self) -> dict:
        return {"active": self.active.to_state(), "args": self.args.to_state(),
                "plain": self._plain, "since": self._since}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
        self.args.load_state(state.get("args", {}))
        self._plain.update(state.get("plain", {}))
        self._since.update(state.get("since", {}))
