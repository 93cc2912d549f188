"""CPU cost of some rules on a recorded log: `specwatch replay --json LOG` in this process with
only the kept rules (`--keep`, default the collapse rule the pipeline needs) and again with the
named rules added; the difference is what the named rules cost, their share of the pipeline's
work for them included (the line-by-line adapter for a rule with `on_decode` / `on_prefill`,
one `on_lines` call per server and evaluation otherwise).

Each of `--runs` rounds runs both, interleaved (a busy machine slows both alike); the minimum of
each is taken. Prints CPU seconds (`time.process_time`) and ns per line of the log.

Usage: python bench/rule_cost.py LOG --rules decode_stalled,log_silent [--keep collapse] [--runs 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwatch import cli  # noqa: E402
from specwatch.rules import base  # noqa: E402


def replay_cpu(log: str, rules: set[str], every: dict) -> float:
    """CPU seconds of one replay of `log` with the registered rules in `rules` only."""
    base.REGISTRY.clear()
    base.REGISTRY.update({k: v for k, v in every.items() if k in rules})
    t = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.main(["replay", "--json", log])
        except SystemExit:
            pass
    return time.process_time() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--rules", required=True, help="comma-separated rule names (Rule.name) to measure")
    ap.add_argument("--keep", default="collapse", help="comma-separated rules present in both runs")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    base.all_rules()
    every = dict(base.REGISTRY)
    named, keep = set(args.rules.split(",")), set(args.keep.split(","))
    unknown = (named | keep) - set(every)
    if unknown:
        ap.error(f"no rule named {', '.join(sorted(unknown))}; known: {', '.join(sorted(every))}")
    without, with_ = [], []
    for _ in range(args.runs):
        without.append(replay_cpu(args.log, keep, every))
        with_.append(replay_cpu(args.log, keep | named, every))
    with open(args.log, "rb") as f:
        lines = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    a, b = min(with_), min(without)
    print(f"{args.log}: {lines} lines; with {a:.2f} CPU-s, without {b:.2f} CPU-s: the rules cost {a - b:.2f} CPU-s, "
          f"{(a - b) / max(lines, 1) * 1e9:.0f} ns per line (min of {args.runs} runs each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
