"""A server's pending batch lines in file order across its ranks (`rules/summary.py`'s `seq`).

A rule whose state is per server (not per rank) reads the lines of all ranks of the server as
one sequence: the summariser numbers every batch line it takes (`seq`, file order across ranks),
so the order in which the lines were read is known without keeping one list for the server.
"""

from __future__ import annotations

from specwatch.rules.summary import SEQ, RankSummary


def first_and_last(ranks: list[RankSummary]) -> tuple | None:
    """(first rank, first entry, last rank, last entry): the server's first and last pending
    decode line in file order; None when no rank has one (prefill lines only)."""
    first = last = None
    lo = hi = 0
    for rs in ranks:
        p = rs.pending
        if p:
            e = p[0]
            if first is None or e[SEQ] < lo:
                first, lo = (rs, e), e[SEQ]
            e = p[-1]
            if last is None or e[SEQ] > hi:
                last, hi = (rs, e), e[SEQ]
    return None if first is None or last is None else first + last


def in_file_order(ranks: list[RankSummary]) -> list[tuple[RankSummary, tuple]]:
    """(rank, entry) of every pending decode line of the server, in file order (for the rules'
    rare sequential passes: it makes a pair per line)."""
    pairs = [(rs, e) for rs in ranks for e in rs.pending]
    if len(ranks) > 1:
        pairs.sort(key=_seq)
    return pairs


def _seq(pair: tuple) -> int:
    return pair[1][SEQ]
