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
from specwatch.rules.summary import ACCEPT, FLAGS, THROUGHPUT, TS, VALID_ACCEPT

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

    def on_lines(self, server: str, ranks: list, emit) -> list:
        for rs in ranks:
            valid = [e for e in rs.pending if e[FLAGS] & VALID_ACCEPT]
            if valid:
                s = self.series.get(rs.key)
                if s is None:
                    s = self.series[rs.key] = Series()
                s.times += [e[TS] for e in valid]
                s.accept_length += [e[ACCEPT] for e in valid]
                s.throughput += [e[THROUGHPUT] for e in valid]
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


FONT = 7  # points, episode labels and legend
LANE_IN = 0.2  # inches per lane of the episode panel
AXES_IN = 9.6  # about the data area's width (inches) in an 11-inch figure
CHAR_EM = 0.62  # a label character's width in font sizes (a generous average, so labels never touch)


def _lanes(episodes: list[tuple[float, float, str]], lo: float, hi: float) -> list[int]:
    """Episode panel rows: each (start, stop, label) in seconds goes to the first lane where
    neither its bar nor its label (drawn from its start) meets an earlier one's. Returns one
    lane number per episode, in the order given (sorted by start)."""
    per_char = CHAR_EM * FONT / 72 / AXES_IN * max(hi - lo, 1e-9)  # seconds one character spans
    ends: list[float] = []
    lanes = []
    for start, stop, label in episodes:
        end = max(stop, start + (len(label) + 2) * per_char)
        lane = next((n for n, e in enumerate(ends) if e < start), len(ends))
        if lane == len(ends):
            ends.append(end)
        ends[lane] = end
        lanes.append(lane)
    return lanes


def render(path: str, recorder: SeriesRecorder, episodes: list[dict], threshold: float) -> dict:
    """Write the plot to `path` (.svg or .png) and return what it shows: {"ranks": {label:
    points}, "episodes": [[start, end], ...] (seconds), "restarts": n}. `episodes` are the replay
    summary's (`replay.episodes`); each is shaded from its start to its end (the last decode
    line when it still fires) and labelled in a panel of its own above the data, one lane per
    overlap. Without decode lines the picture is only a message (no axes). Raises
    PlotUnavailable without matplotlib; OSError when the file cannot be written."""
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
    shown: dict = {"ranks": {}, "episodes": [], "restarts": 0}
    kind = Path(path).suffix.lower()[1:]
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "specwatch"}):  # SVG text stays text
        if not times:
            fig = plt.figure(figsize=(11, 2.5))
            fig.text(0.5, 0.5, "specwatch replay: no decode lines under load in this log, so no accept length "
                     f"to draw\n({len(episodes)} alert episode(s), {len(recorder.restarts)} restart(s): "
                     "see the report)", ha="center", va="center", fontsize=11).set_gid("no-data")
            fig.savefig(path, format=kind, dpi=110, metadata={"Date": None} if kind == "svg" else None)
            plt.close(fig)
            return shown

        spans = []
        for e in episodes:
            start = _seconds(e["starts_at"])
            stop = _seconds(e["ends_at"]) if e.get("ends_at") else max(end, start)
            spans.append((start, stop, f"{e['name']} {e.get('rank', '')}".strip()))
        lo, hi = min(times + [s for s, _, _ in spans]), max(times + [t for _, t, _ in spans])
        pad = max((hi - lo) * 0.02, 1.0)
        lo, hi = lo - pad, hi + pad
        order = sorted(range(len(spans)), key=lambda i: spans[i][0])
        lane_of = dict(zip(order, _lanes([spans[i] for i in order], lo, hi)))
        n_lanes = max(lane_of.values(), default=-1) + 1
        rows = ((n_lanes * LANE_IN + 0.1,) if n_lanes else ()) + (3.2, 1.6)
        fig, axes = plt.subplots(len(rows), 1, sharex=True, figsize=(11, 1.6 + sum(rows)), height_ratios=rows,
                                 layout="constrained")
        lane_ax, ax, ax2 = axes if n_lanes else (None, *axes)
        ax.patch.set_gid("accept-length-axes")
        ax2.patch.set_gid("throughput-axes")

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

        for i, (start, stop, text) in enumerate(spans):
            color = "red" if episodes[i]["name"] == "AcceptanceCollapse" else "darkorange"
            ax.axvspan(to_dt(start), to_dt(stop), color=color, alpha=0.12, lw=0).set_gid(f"episode-{i}")
            lane = lane_of[i]
            lane_ax.barh(lane, (to_dt(stop) - to_dt(start)).total_seconds() / 86400, left=to_dt(start), height=0.8,
                         color=color, alpha=0.15, lw=0).patches[0].set_gid(f"episode-{i}-bar")
            lane_ax.text(to_dt(start), lane, f" {text}", va="center", ha="left", fontsize=FONT, color=color,
                         clip_on=False).set_gid(f"episode-{i}-label")
            shown["episodes"].append([start, stop])
        if lane_ax is not None:
            lane_ax.set_ylim(n_lanes - 0.5, -0.5)
            lane_ax.set_yticks([])
            lane_ax.tick_params(axis="x", length=0)
            lane_ax.set_ylabel("alerts", rotation=0, ha="right", va="center", fontsize=FONT + 1)
            for side in ("left", "right", "top"):
                lane_ax.spines[side].set_visible(False)
        for i, (_server, at) in enumerate(recorder.restarts):
            for a in (ax, ax2):
                a.axvline(to_dt(at), color="grey", ls=":", lw=1).set_gid(f"restart-{i}-{a is ax2:d}")
            ax2.annotate(" restart", (to_dt(at), 0.02), xycoords=("data", "axes fraction"), fontsize=FONT, color="grey")
            shown["restarts"] += 1

        values = [v for s in recorder.series.values() for v in s.accept_length]
        bottom = min(0.9, threshold - 0.2, min(values) - 0.05)
        top = max(max(values), threshold)
        ax.set_ylim(bottom, top + 0.08 * (top - bottom))  # the threshold never sits on the frame
        ax.set_xlim(to_dt(lo), to_dt(hi))
        ax.set_ylabel("accept length\n(tokens / verify round)")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 9), fontsize=FONT,
                   frameon=False).set_gid("legend")
        fig.suptitle("specwatch replay: accept length per rank")
        ax2.set_ylabel("gen throughput\n(token/s)")
        ax2.grid(alpha=0.3)
        ax2.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M:%S", tz=timezone.utc))
        ax2.set_xlabel("log time (UTC)")
        for t in ax2.get_xticklabels():
            t.set(rotation=20, ha="right")
        fig.savefig(path, format=kind, dpi=110, metadata={"Date": None} if kind == "svg" else None)
        plt.close(fig)
    return shown
