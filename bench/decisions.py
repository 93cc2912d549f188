"""Record what `specwatch replay --json` decides on a set of logs, and compare two recordings.

A recording is a folder with one JSON document per log: its alert episodes and transitions
(name, status, severity, every label, server and rank among them, `starts_at`/`ends_at` cut to
the second), the line counts, and, apart from the decisions, how the replay ran (command, exit
status, wall and CPU seconds). Episodes and transitions are sorted, so two recordings of the
same decisions are equal whatever order the alerts were handed out in; summaries and evidence
(figures a rewrite may round differently) are left out.

Record (each LOG a file, or a folder: its files matching `--glob`, recursively):
    python3 bench/decisions.py record OUT LOG... [--config CFG] [--repo DIR]
Compare two recordings (exit 1 on any difference, 0 when equal):
    python3 bench/decisions.py --compare OLD NEW

The replay runs `python3 -m specwatch` of `--repo` (default: the checkout holding this file)
in a subprocess, so a recording says what that tree decides, whatever specwatch is installed.
Stdlib only.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import resource
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_FRACTION = re.compile(r"\.\d+(?=Z$)")


def second(stamp: str | None) -> str | None:
    """An RFC 3339 stamp of `replay --json` cut to the second (`...:42.731Z` -> `...:42Z`)."""
    return None if stamp is None else _FRACTION.sub("", stamp)


def decision(entry: dict) -> dict:
    """One `replay --json` alert or episode, as compared: what was decided, not how it reads."""
    return {
        "name": entry["name"],
        "status": entry["status"],
        "severity": entry.get("severity", ""),
        "server": entry.get("server", ""),
        "rank": entry.get("rank", ""),
        "starts_at": second(entry.get("starts_at")),
        "ends_at": second(entry.get("ends_at")),
        "labels": dict(sorted(entry.get("labels", {}).items())),
    }


def _order(d: dict) -> tuple:
    return (d["starts_at"] or "", d["name"], json.dumps(d["labels"], sort_keys=True), d["status"],
            d["ends_at"] or "")


def normalize(doc: dict) -> dict:
    """The decisions of one `replay --json` document: episodes and transitions, sorted; the line
    counts (decode, prefill, other, malformed, unrecognized, total)."""
    return {
        "episodes": sorted((decision(e) for e in doc.get("episodes", [])), key=_order),
        "alerts": sorted((decision(a) for a in doc.get("alerts", [])), key=_order),
        "lines": dict(sorted(doc.get("lines", {}).items())),
    }


def logs_of(paths: list[str], glob: str) -> list[Path]:
    """Each path that is a file, and the files under each folder whose names match `glob`."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and fnmatch.fnmatch(f.name, glob))
        else:
            out.append(p)
    return out


def replay(log: Path, config: str | None, repo: Path, timeout: float) -> tuple[dict, dict]:
    """`specwatch replay --json LOG [--config CFG]` from `repo`; returns (decisions, how it ran).
    A replay that fails or prints no JSON gives the decisions {"error": ...}."""
    cmd = [sys.executable, "-m", "specwatch", "replay", "--json", "--log-level", "error", str(log.resolve())]
    if config:
        cmd += ["--config", str(Path(config).resolve())]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo, timeout=timeout)
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", f"timed out after {timeout:.0f} s"
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    ran = {"command": " ".join(["specwatch"] + cmd[3:]), "rc": rc, "wall_s": round(wall, 2),
           "cpu_s": round(cpu, 2), "bytes": log.stat().st_size}
    try:
        return normalize(json.loads(out)), ran
    except (json.JSONDecodeError, AttributeError):
        return {"error": f"rc {rc}: {err.strip()[-2000:]}"}, ran


def commit_of(repo: Path) -> str:
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def key_of(log: Path) -> str:
    """The recording's file name for `log`: its parent folder and name (`bugreport-logs/BR-01.log`
    -> `bugreport-logs__BR-01.log.json`), so two folders' `server.log` do not collide."""
    return f"{log.parent.name}__{log.name}.json"


def record(out: Path, paths: list[str], config: str | None, glob: str, repo: Path, timeout: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    commit = commit_of(repo)
    failed = 0
    for log in logs_of(paths, glob):
        decisions, ran = replay(log, config, repo, timeout)
        failed += "error" in decisions
        doc = {"log": str(log), "config": config, "commit": commit, "decisions": decisions, "run": ran}
        (out / key_of(log)).write_text(json.dumps(doc, indent=1) + "\n")
        n = len(decisions.get("episodes", []))
        print(f"{log}: {n} episode(s), rc {ran['rc']}, {ran['wall_s']:.2f} s wall, {ran['cpu_s']:.2f} CPU-s"
              + (f"  ERROR {decisions['error'][:200]}" if "error" in decisions else ""), flush=True)
    return 1 if failed else 0


def _load(path: Path) -> dict[str, dict]:
    files = sorted(path.glob("*.json")) if path.is_dir() else [path]
    return {f.name: json.loads(f.read_text()) for f in files}


def _show(d: dict) -> str:
    labels = {k: v for k, v in d["labels"].items() if k not in ("alertname", "severity", "server", "rank")}
    where = " ".join(x for x in (d["server"], d["rank"]) if x)
    return (f"{d['name']} [{d['severity']}] on {where or '-'}: {d['status']} {d['starts_at']} -> {d['ends_at']}"
            + (f" {labels}" if labels else ""))


def compare(old: Path, new: Path) -> int:
    """Print every difference between two recordings (folders or single files); 1 if any."""
    a, b = _load(old), _load(new)
    diffs = 0
    for name in sorted(a.keys() | b.keys()):
        if name not in b or name not in a:
            print(f"{name}: only in {old if name in a else new}")
            diffs += 1
            continue
        da, db = a[name]["decisions"], b[name]["decisions"]
        if da == db:
            continue
        print(f"{name} ({a[name]['log']}; {a[name].get('commit')} -> {b[name].get('commit')}):")
        for key in ("error",):
            if da.get(key) != db.get(key):
                print(f"  error: {da.get(key)!r} -> {db.get(key)!r}")
        for key in ("episodes", "alerts"):
            sa = Counter(json.dumps(x, sort_keys=True) for x in da.get(key, []))
            sb = Counter(json.dumps(x, sort_keys=True) for x in db.get(key, []))
            for sign, xs in (("-", sa - sb), ("+", sb - sa)):
                for x in sorted(xs.elements(), key=lambda x: _order(json.loads(x))):
                    print(f"  {sign} {key[:-1]}: {_show(json.loads(x))}")
        if da.get("lines") != db.get("lines"):
            print(f"  lines: {da.get('lines')} -> {db.get('lines')}")
        diffs += 1
    print(f"{diffs} log(s) differ" if diffs else f"same decisions on {len(a)} log(s)")
    return 1 if diffs else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two recordings; exit 1 on any difference")
    p.add_argument("mode", nargs="?", choices=["record"], help="record OUT LOG...")
    p.add_argument("args", nargs="*", metavar="OUT LOG", help="the recording's folder, then logs or folders")
    p.add_argument("--config", help="the replays' --config (every log of this call)")
    p.add_argument("--glob", default="*.log*", help="files of a folder to replay (default: *.log*)")
    p.add_argument("--repo", type=Path, default=REPO, help="the specwatch tree to run (default: this checkout)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per replay (default 1800)")
    a = p.parse_intermixed_args(argv)
    if a.compare:
        return compare(Path(a.compare[0]), Path(a.compare[1]))
    if a.mode != "record" or len(a.args) < 2:
        p.error("give `record OUT LOG...` or `--compare OLD NEW`")
    return record(Path(a.args[0]), a.args[1:], a.config, a.glob, a.repo.resolve(), a.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
