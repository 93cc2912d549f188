"""Decode stalled: requests were running and no decode line came since.

A wedged scheduler (a hung kernel or collective, a deadlock) prints nothing more, while the HTTP
server around it stays up: access lines may keep arriving, the process runs, and `/health`, which
sends a one-token generation through the scheduler, times out (`health_generate`,
sglang/srt/entrypoints/http_server.py 0.5.11-0.5.23: 503 and the ERROR line `Health check failed.
Server couldn't get a response from detokenizer …`). `DecodeStalled` (critical) fires when a rank's
last decode line showed running requests and no decode line came for a while: `for` when since
that line the health check failed (`/health` not 200 from the HTTP API source, or that ERROR line
in the log: any client's health probe writes it); `silent_for` when nothing said whether the
server is healthy (the plain-file setup, `… 2>&1 | tee -a server.log`: the log alone). A `/health`
that answered 200 since the last decode line says the scheduler moves: nothing fires. It fires
from the ticks (a live clock: a log that stays silent), and in a replay at the decode line that
ends such a gap, or at the restart (`server_args` line) that does (then it resolves at once).
It resolves at the next decode line, or when the
server stops or restarts (the down and restart alerts take over).

The log-only case cannot tell a wedge from traffic that stopped: SGLang prints a decode line
every `--decode-log-interval` rounds, not when the batch drains, so the last line before traffic
stops may show running requests. `silent_for` (2m) is set above the time the batch of that last
line takes to drain; raise it where bursts end with long generations. There it pages only when
the log shows more than silence after a steady batch (queued requests, lines still arriving): a
batch that was shrinking at its last line may have drained, and is a warning. `SGLangLogSilent` is the
opposite case (the scheduler decodes, its lines do not reach specwatch); the scheduler's own
`--watchdog-timeout` (300 s) kills a forward pass stuck that long, so this alert often precedes a
crash and restart (`ServerLogError`, kind `watchdog_timeout`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import copy
from collections import defaultdict

import msgspec

from specwatch.alerts.model import Alert, iso8601
from specwatch.core.sections import Seconds, Section, rule_section
from specwatch.core.events import ApiSample, LogError, ProcessSample, ServerArgs, ServerProcess
from specwatch.core.logclock import MAX_ZONE
from specwatch.rules.active import ActiveAlertsRule
from specwatch.rules.base import RuleContext, args_evidence, new_alert, register
from specwatch.rules.summary import CLOCK, QUEUED, RUNNING, SEQ, SRC, TS, prefill_counts

if TYPE_CHECKING:  # annotations only: rule files never import config.py
    from specwatch.config import Config


@rule_section("decode_stalled")
class DecodeStalledConfig(Section):
    enabled: bool = True
    hold: Seconds = msgspec.field(default=120.0, name="for")  # no decode line this long after a failed health check
    silent_for: Seconds = 120.0  # no decode line this long, and no health check either way (the log alone)


ALERT_NAME = "DecodeStalled"
FAR_AHEAD = MAX_ZONE + 3600.0  # seconds a decode line's stamp may run ahead of the clock reading it


class _State:
    __slots__ = ("last_decode", "running", "queued", "unhealthy", "healthy", "process", "watched", "api_reachable",
                 "args", "last", "draining", "stamps")

    def __init__(self) -> None:
        self.last_decode: float | None = None  # clock of the last decode line of any rank
        self.running: dict[str, tuple[int, int]] = {}  # rank → (running, queued) of its last decode line
        self.unhealthy: tuple[float, str] | None = None  # last failed health check: (clock, what)
        self.healthy: float | None = None  # clock of the last /health 200
        self.last: tuple | None = None  # the last decode line: (its RankSummary, its pending entry)
        self.draining = False  # the last decode line showed fewer running requests than its rank's one before
        self.process: ServerProcess | None = None
        self.watched = False
        self.api_reachable: float | None = None  # clock of the last HTTP answer
        self.args: dict = {}
        self.stamps: dict[str, float] = {}  # rank → the stamp of its newest decode line

    @property
    def last_batch(self):
        """The last decode line's DecodeBatch (built when an alert or a restart reads it)."""
        return None if self.last is None else self.last[0].batch(self.last[1])


def _engine(entry: tuple) -> str:
    """The engine that printed a pending decode line: a canonical line's groups are SGLang's."""
    src = entry[SRC]
    return "sglang" if type(src) is tuple else src.engine


def _describe(b, at: float | None) -> str:
    """The last decode line as evidence: its time, rank and counts."""
    if b is None:
        return iso8601(at) or "n/a"
    parts = [f"#running-req: {b.running_requests}", f"#queue-req: {b.queued_requests}"]
    if b.accept_length is not None:
        parts.append(f"accept len: {b.accept_length:.2f}")
    if b.gen_throughput is not None:
        parts.append(f"gen throughput (token/s): {b.gen_throughput:.2f}")
    return f"{iso8601(at)} {b.rank or 'single rank'}: Decode batch, " + ", ".join(parts)


def _arriving(rs) -> tuple[str, str]:
    """The evidence of a resolve: decode lines again, from that rank."""
    return ("decode lines", f"arriving again ({rs.rank or 'single rank'})")


def _first(item: tuple) -> int:
    return item[0]


@register
class DecodeStalledRule(ActiveAlertsRule):
    name = "decode_stalled"
    alert_names = (ALERT_NAME,)
    order = 35

    @classmethod
    def build(cls, config: Config, ctx: RuleContext) -> "DecodeStalledRule":
        return cls(config.decode_stalled, ctx.last_lines)

    def __init__(self, config: DecodeStalledConfig, last_lines=None):
        super().__init__()
        self.config = config
        self.last_lines = last_lines  # server → {line kind: clock of its last line} (the pipeline's)
        self._s: defaultdict[str, _State] = defaultdict(_State)  # server → state, made on first use

    def reconfigure(self, config: Config) -> None:
        self.config = config.decode_stalled

    def on_lines(self, server: str, ranks: list, emit) -> list[Alert]:
        """The server's batch lines since the last evaluation. A decode line that shows the
        scheduler moving (`_progress`) sets the server's last decode line, its rank's running /
        queued requests and `draining` (fewer running than at the rank's line before it); a
        prefill line sets its rank's running / queued (its `#running-req` is the rank's decode
        batch now: 0 after a burst drained and traffic came back), and is no decode progress.
        Lines count in file order across ranks (`seq`).

        In the common case (every line of each rank stamped no earlier than the one before it,
        and no gap of `_shortest()` possible between the server's lines: one pass over the
        stamps and clocks tells) only each rank's last lines decide: the last decode line is the
        server's line with the highest `seq`, and its rank's line before it gives `draining`.
        Otherwise (a gap no tick saw, as in a replay; lines stamped out of order) the lines are
        read one by one in file order: at a decode line after such a gap, the stall is judged as
        a live clock would have judged it during the gap. Both give what reading the lines one at
        a time gives."""
        st = self._s[server]
        # The common case, checked and read in one pass: each rank's lines stamped and read
        # (clock) in order from its newest stamp on, none more than FAR_AHEAD ahead of the clock
        # that reads it, and (the rule on) the lines and the last decode line spanning less than
        # `_shortest()` of clock, so no line can show a gap. While the alert fires the line that
        # resolves it ends such a gap: read one by one, a later gap may fire it again.
        stamps = st.stamps
        lo = hi = st.last_decode
        first = last = None  # the server's first and last decode line: (rank, entry)
        fseq = lseq = 0
        for rs in ranks:
            p = rs.pending
            if not p:
                continue
            e = p[0]
            c0 = pc = e[CLOCK]
            pt = stamps.get(rs.rank)
            if pt is None:
                pt = e[TS]
            for e in p:
                t, c = e[TS], e[CLOCK]
                if t < pt or c < pc:
                    return self._one_by_one(server, st, ranks)
                pt, pc = t, c
            if pt - c0 > FAR_AHEAD:
                return self._one_by_one(server, st, ranks)
            if lo is None or c0 < lo:
                lo = c0
            if hi is None or pc > hi:
                hi = pc
            if first is None or p[0][SEQ] < fseq:
                first, fseq = rs, p[0][SEQ]
            if last is None or e[SEQ] > lseq:
                last, lseq = rs, e[SEQ]
        if self.config.enabled and lo is not None and hi is not None and hi - lo >= self._shortest():
            return self._one_by_one(server, st, ranks)
        running = st.running
        if last is not None:  # `draining`: the last decode line against its rank's line before it
            p = last.pending
            e = p[-1]
            before = running.get(last.rank)
            seq = 0
            if len(p) > 1:
                before, seq = (p[-2][RUNNING], p[-2][QUEUED]), p[-2][SEQ]
            pre = last.pending_prefills
            for i in range(len(pre) - 1, -1, -1):  # the rank's last prefill line before it, if later
                if pre[i][2] < lseq:
                    if pre[i][2] > seq:
                        before = prefill_counts(pre[i])
                    break
            st.draining = before is not None and e[RUNNING] < before[0]
            st.last_decode = e[CLOCK]
            st.last = (last, e)
        for rs in ranks:  # each rank's last line, decode or prefill, gives its running / queued
            p, pre = rs.pending, rs.pending_prefills
            if p:
                e = p[-1]
                stamps[rs.rank] = e[TS]
                if pre and pre[-1][2] > e[SEQ]:
                    running[rs.rank] = prefill_counts(pre[-1])
                else:
                    running[rs.rank] = (e[RUNNING], e[QUEUED])
            elif pre:
                running[rs.rank] = prefill_counts(pre[-1])
        if first is None or server not in self.active:
            return []  # the common case
        return self.active.resolve(server, first.pending[0][CLOCK], _arriving(first))

    def _one_by_one(self, server: str, st: _State, ranks: list) -> list[Alert]:
        """The lines one at a time in file order (`on_lines` where a line may show a gap, or one
        is stamped out of order)."""
        items = [(e[SEQ], rs, e) for rs in ranks for e in rs.pending]
        items += [(pf[2], rs, prefill_counts(pf)) for rs in ranks for pf in rs.pending_prefills]
        items.sort(key=_first)
        out = []
        for _, rs, e in items:
            if len(e) == 2:  # a prefill line's (running, queued)
                st.running[rs.rank] = e
                continue
            now = e[CLOCK]
            if st.last_decode is not None and _engine(e) == "sglang":
                # A gap no tick saw (a replay): SGLang prefills new requests first (a `Prefill batch`
                # line), so a decode line right after the gap is the same batch decoding on. vLLM
                # prints no prefill line: there a gap cannot be told from idle time.
                out += self._seen(server, st, now, handed=True)
            if not self._progress(st, rs.rank, e[TS], now):
                continue
            st.last_decode = now
            st.last = (rs, e)
            before = st.running.get(rs.rank)
            st.draining = before is not None and e[RUNNING] < before[0]
            st.running[rs.rank] = (e[RUNNING], e[QUEUED])
            if server in self.active:
                out += self.active.resolve(server, now, _arriving(rs))
        return out

    @staticmethod
    def _progress(st: _State, rank: str, t: float, now: float) -> bool:
        """Whether a decode line of `rank` stamped `t` (read at `now`) shows the scheduler moving:
        not when it is stamped before its rank's newest decode line (a line pasted or replayed
        into the log), nor when its stamp is more than a day ahead of the clock that reads it (no
        zone explains that: `logclock.MAX_ZONE`; a line from another year). Such a line neither
        resolves the alert nor restarts the silence."""
        newest = st.stamps.get(rank)
        if newest is not None and t < newest or t - now > FAR_AHEAD:
            return False
        st.stamps[rank] = t
        return True

    @staticmethod
    def _watchdog(st: _State) -> float:
        """SGLang's `--watchdog-timeout` (300 s by default, sglang/srt/server_args.py 0.4-0.5.23): a
        forward pass stuck longer kills the server, so a gap longer than it past the threshold
        is not a stall a tick would have seen (a log of lines spliced together, an idle
        decode-only server, specwatch itself stopped meanwhile)."""
        try:
            return float(st.args.get("watchdog_timeout") or 300.0)
        except (TypeError, ValueError):
            return 300.0

    def _shortest(self) -> float:
        return min(self.config.hold, self.config.silent_for)

    def on_restart(self, server: str, at: float, why: str) -> list[Alert]:
        """The server (re)started at `at`: its state is dropped and the alert resolves. A gap no
        tick saw (a replay) that the restart ends is a stall first, as a live clock would have
        fired it during the gap: the hang that led to the restart."""
        st = self._s.pop(server, None)
        if st is None:
            return []
        # as in on_lines: vLLM prints no prefill line, so its gaps cannot be told from idle time
        gap = st.last is not None and _engine(st.last[1]) == "sglang"
        return (self._seen(server, st, at, handed=True) if gap else []) + self.active.resolve(server, at, ("server", why))

    def forget_rank(self, server: str, rank: str, at: float, why: str) -> list[Alert]:
        """A gone rank's last decode line no longer counts in the server's running requests."""
        st = self._s.get(server)
        if st is not None:
            st.running.pop(rank, None)
            st.stamps.pop(rank, None)
        return []

    def _seen(self, server: str, st: _State, now: float, handed: bool = False) -> list[Alert]:
        """`_check` once `now` is `_shortest()` past the last decode line (a tick, or a line
        that shows a gap no tick saw). `handed`: the caller resolves the alert at once, so its
        firing state goes out as a copy first."""
        if not self.config.enabled or server in self.active or st.last_decode is None \
                or now - st.last_decode < self._shortest():
            return []
        out = self._check(server, st, now, st.last_decode)
        return [copy.deepcopy(a) for a in out] if handed else out

    def on_event(self, server: str, event: object, now: float) -> list[Alert]:
        if type(event) is LogError:
            if event.kind == "health_check":
                self._s[server].unhealthy = (now, "log: " + event.lines[0][:200])
        elif isinstance(event, ApiSample):
            st = self._s[server]
            if event.reachable:
                st.api_reachable = now
            if event.healthy is False:
                st.unhealthy = (now, f"/health answered {event.health_status}" if event.health_status
                                else "/health did not answer")
            elif event.healthy:
                st.healthy = now
                if st.unhealthy is not None and st.unhealthy[0] < now:
                    st.unhealthy = None  # it answers: whatever was stuck moves again
        elif isinstance(event, ProcessSample):
            st = self._s[server]
            st.watched, st.process = True, event.process
            if event.process is None:
                st.running.clear()
                return self.active.resolve(server, now, ("server", "stopped"))
        elif isinstance(event, ServerArgs):
            self._s[server].args = dict(event.args)
        return []

    def on_tick(self, now: float) -> list[Alert]:
        if not self.config.enabled:
            return []
        out = []
        for server, st in self._s.items():
            out += self._seen(server, st, now)
        return out

    def _threshold(self, st: _State, last_decode: float) -> float | None:
        """How long without a decode line is a stall: `for` after a failed health check since the
        last decode line, None after a passed one (the scheduler answers), else `silent_for`."""
        if st.unhealthy is not None and st.unhealthy[0] >= last_decode:
            return self.config.hold
        if st.healthy is not None and st.healthy >= last_decode:
            return None
        return self.config.silent_for

    def _check(self, server: str, st: _State, now: float, last_decode: float) -> list[Alert]:
        """The one decision: fire when the last decode line showed running requests, the server
        runs (or nothing says it does not), and no decode line came for `_threshold`."""
        limit = self._threshold(st, last_decode)
        if limit is None or not limit <= now - last_decode <= limit + self._watchdog(st):
            return []  # a longer gap is not seen live: lines spliced together, specwatch itself stopped
        if not any(r for r, _ in st.running.values()) or (st.watched and st.process is None):
            return []
        return self.active.fire(server, self._alert(server, st, now, limit, last_decode))

    def _alert(self, server: str, st: _State, now: float, limit: float, last_decode: float) -> Alert:
        running = sum(r for r, _ in st.running.values())
        queued = sum(q for _, q in st.running.values())
        last = (self.last_lines(server) if self.last_lines else {}) or {}
        alive = []
        if st.process is not None:
            alive.append(f"process {st.process.pid} runs")
        if st.api_reachable is not None and st.api_reachable > last_decode:
            alive.append("the HTTP API answers")
        other = last.get("other")
        if other is not None and other > last_decode:
            alive.append(f"other log lines until {iso8601(other)}")
        later = [f"{k} lines until {iso8601(t)}" for k, t in sorted(last.items())
                 if k not in ("decode",) and t > last_decode]
        unhealthy = st.unhealthy
        log_only = unhealthy is None or unhealthy[0] < last_decode
        evidence = [
            ("running requests at the last decode line", str(running)),
            ("queued requests at the last decode line", str(queued)),
            ("last decode line", _describe(st.last_batch, last_decode)),
            ("no decode line for", f"{now - last_decode:.0f}s"),
            ("health check", "none seen since the last decode line (the log alone: silent_for "
             f"{limit:.0f}s)" if unhealthy is None or log_only else f"{unhealthy[1]} at {iso8601(unhealthy[0])}"),
            ("still arriving", "; ".join(later) or "nothing: the log is silent"),
            ("server alive", "; ".join(alive) or "unknown"),
        ]
        if len(st.running) > 1:
            evidence.append(("ranks", ", ".join(f"{r or '-'}: {n} running" for r, (n, _) in sorted(st.running.items()))))
        evidence += args_evidence(st.args)
        pid = st.process.pid if st.process is not None else "PID"
        watchdog = st.args.get("watchdog_timeout")
        # The log alone cannot tell a wedge from a burst that drained after its last line (SGLang
        # logs every --decode-log-interval rounds, not when the batch empties): a page needs a
        # failed health check, queued requests, lines still arriving, or a batch that was not
        # shrinking; a draining one is a warning.
        certain = not log_only or queued > 0 or bool(later) or not st.draining
        return new_alert(
            ALERT_NAME, "critical" if certain else "warning", server, "",
            summary=f"Decoding stalled on {server}: {running} request(s) running, no decode line for {now - last_decode:.0f}s",
            description=(
                f"The last decode line showed {running} running request(s); no decode line since "
                f"{iso8601(last_decode)}"
                + (f" ({now - last_decode:.0f}s), and nothing else says the scheduler moves. "
                   "The scheduler makes no progress: every request hangs (or traffic stopped with that "
                   "batch, if its requests were about to finish)." if log_only else
                   ", and the health check fails, which sends a one-token generation through the "
                   "scheduler. The HTTP server is up but the scheduler makes no progress: every request hangs.")
            ),
            starts_at=now,
            evidence=evidence,
            fixes=[
                f"See where the scheduler is stuck before restarting: `py-spy dump --pid {pid}` on the "
                "scheduler processes (`pstree -p` under the launcher), `nvidia-smi` (a GPU at 100 % with "
                "no progress is a hung kernel or collective).",
                "A hung collective shows on the other ranks and nodes: look for an NCCL timeout or a "
                "traceback in their logs, and XIDs in `journalctl -k | grep -i xid`.",
                "SGLang's `--watchdog-timeout` ("
                + (f"now {watchdog} s" if watchdog is not None else "300 s by default")
                + ") crashes a scheduler whose forward pass takes longer; a lower value turns a hang into "
                "a restart. Restart the server to serve again.",
            ],
        )

    def to_state(self) -> dict:  # last_batch is not kept: the evidence then names the line by its time
        return {"active": self.active.to_state(),
                "servers": {s: {"last_decode": st.last_decode, "running": {r: list(v) for r, v in st.running.items()}}
                            for s, st in self._s.items() if st.last_decode is not None}}

    def load_state(self, state: dict) -> None:
        self.active.load_state(state.get("active", {}))
        for server, d in (state.get("servers") or {}).items():
            try:
                st = self._s[server]
                st.last_decode = float(d["last_decode"])
                st.running = {str(r): (int(v[0]), int(v[1])) for r, v in d["running"].items()}
            except (KeyError, TypeError, ValueError, IndexError):
                self._s.pop(server, None)
