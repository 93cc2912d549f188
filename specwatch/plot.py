"""`specwatch replay LOG --plot OUT.svg|png`: accept length per rank over the log's time, the
collapse threshold, alert episodes shaded, restarts marked; gen throughput on a second panel.

`SeriesRecorder` is a rule that raises nothing: replay adds it to its pipeline (`extra_rules`) and
it keeps every decode line that describes the draft under load (the `Window.acceptance_valid`
lines the collapse rule reads), so the plot shows what the rules saw. `render` draws with
matplotlib (the optional extra `specwatch[plot]`), imported only here, with the Agg backend (no
display). SVG elements carry ids (`accept-length-<rank>`, `throughput-<rank>`, `episode-<n>`,
`restart-<n>-<panel>`) so a reader or a test can find each series.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from specwatch.rules.base import Rule

EXTRA_HINT = "pip install 'specwatch[plot]' (from a checkout: pip install '.[plot]')"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed, or the output suffix is neither .svg nor .png."""


@dataclass
class Series:
    """One rank's decode lines: times (seconds since the epoch), accept length (tokens per verify
    round), gen throughput (tokens/s; None where the line had none)."""

    times: list[float] = field(default_factory=list)
    accept_length: list[float] = field(default_factory=list)
    throughput: list[float | None] = field(default_factory=list)


class SeriesRecorder(Rule):
    """Collects `Series` per (server, rank) and restart times per server; raises no alert."""

    name = "series_recorder"

    def __init__(self) -> None:
        self.series: dict[tuple[str, str], Series] = {}
        self.restarts: list[tuple[str, float]] = []

    def on_decode(self, server: str, window, now: float) -> list:
        if window.acceptance_valid:
            b = window.batch
            s = self.series.get((server, b.rank))
            if s is None:
                s = self.series[(server, b.rank)] = Series()
            s.times.append(b.timestamp)
            s.accept_length.append(b.accept_length)
            s.throughput.append(b.gen_throughput)
        return []

    def on_restart(self, server: str, at: float, why: str) -> list:
        self.restarts.append((server, at))
        return []


def check_output(path: str) -> None:
    """Raises PlotUnavailable before a replay starts: a suffix other than .svg/.png, a folder that
    does not exist or cannot be written, a path that is a folder, or no matplotlib."""
    out = Path(path)
    if out.suffix.lower() not in (".svg", ".png"):
        raise PlotUnavailable(f"--plot {path}: give a file ending in .svg or .png")
    folder = out.parent
    if not folder.is_dir():
        why = "is not a folder" if folder.exists() else "does not exist"
        raise PlotUnavailable(f"--plot {path}: the folder {folder} {why}")
    if out.is_dir():
        raise PlotUnavailable(f"--plot {path}: is a folder; give a file ending in .svg or .png")
    if not os.access(folder, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise PlotUnavailable(f"--plot {path}: cannot write to {out if out.exists() else folder} (permission denied)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable(f"--plot needs matplotlib, which is not installed: {EXTRA_HINT}") from None


def _seconds(iso: str) -> float:
    """`alerts.model.iso8601` text (`2026-03-01T10:00:11Z`) → seconds since the epoch."""
    return datetime.fromisoformat(iso).timestamp()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text.strip()) or "single"


def render(path: str, recorder: SeriesRecorder, episodes: list[dict], threshold: float) -> dict:
    """Write the plot to `path` (.svg or .png) and return what it shows: {"ranks": {label:
    points}, "episodes": [[start, end], ...] (seconds), "restarts": n}. `episodes` are the replay
    summary's (`replay.episodes`); each is shaded from its start to its end (the last decode
    line when it still fires). Raises PlotUnavailable without matplotlib."""
    check_output(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    multi = len({s for s, _ in recorder.series}) > 1
    label = lambda server, rank: (f"{server} {rank}" if multi else rank).strip() or "single rank"  # noqa: E731
    times = [t for s in recorder.series.values() for t in s.times]
    end = max(times, default=0.0)
    to_dt = lambda t: datetime.fromtimestamp(t, timezone.utc)  # noqa: E731

    fig, (ax, ax2) = plt.subplots(2, 1, sharex=True, figsize=(11, 6.5), height_ratios=(2, 1),
                                  layout="constrained")
    shown: dict = {"ranks": {}, "episodes": [], "restarts": 0}
    for (server, rank), s in sorted(recorder.series.items()):
        name = label(server, rank)
        xs = [to_dt(t) for t in s.times]
        line, = ax.plot(xs, s.accept_length, lw=1.2, marker="." if len(xs) < 200 else None, label=name)
        line.set_gid(f"accept-length-{_slug(name)}")
        tp = [(x, v) for x, v in zip(xs, s.throughput) if v is not None]
        if tp:
            t_line, = ax2.plot([x for x, _ in tp], [v for _, v in tp], lw=1, color=line.get_color(), label=name)
            t_line.set_gid(f"throughput-{_slug(name)}")
        shown["ranks"][name] = len(xs)
    ax.axhline(threshold, color="red", ls="--", lw=1, label=f"collapse threshold {threshold:.2f}").set_gid("threshold")

    for i, e in enumerate(episodes):
        start = _seconds(e["starts_at"])
        stop = _seconds(e["ends_at"]) if e.get("ends_at") else max(end, start)
        color = "red" if e["name"] == "AcceptanceCollapse" else "orange"
        span = ax.axvspan(to_dt(start), to_dt(stop), color=color, alpha=0.12, lw=0)
        span.set_gid(f"episode-{i}")
        ax.annotate(f" {e['name']} {e.get('rank', '')}", (to_dt(start), 1.0 - 0.06 * (i % 4)),
                    xycoords=("data", "axes fraction"), va="top", fontsize=7, color=color)
        shown["episodes"].append([start, stop])
    for i, (server, at) in enumerate(recorder.restarts):
        for a in (ax, ax2):
            a.axvline(to_dt(at), color="grey", ls=":", lw=1).set_gid(f"restart-{i}-{a is ax2:d}")
        ax2.annotate(" restart", (to_dt(at), 0.02), xycoords=("data", "axes fraction"), fontsize=7, color="grey")
        shown["restarts"] += 1

    ax.set_ylabel("accept length (tokens / verify round)")
    ax.set_ylim(bottom=min(0.9, threshold - 0.2))
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=7, ncols=4)
    ax.set_title("specwatch replay: accept length per rank" + ("" if times else " (no decode lines under load)"))
    ax2.set_ylabel("gen throughput (token/s)")
    ax2.grid(alpha=0.3)
    ax2.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M:%S", tz=timezone.utc))
    ax2.set_xlabel("log time (UTC)")
    fig.autofmt_xdate()
    kind = Path(path).suffix.lower()[1:]
    fig.savefig(path, format=kind, dpi=110, metadata={"Date": None} if kind == "svg" else None)
    plt.close(fig)
    return shown
