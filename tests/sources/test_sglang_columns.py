"""`sources.sglang_columns.parse` reads exactly what the canonical regexes of `sglang_log` read.

The reference is one multiline regex over the read (`_CANONICAL_DECODE` and `_CANONICAL_PREFILL`
anchored at line starts and ends): the columns must hold the same rows with the same values
(`int`, `float` and `_timestamp` of the matched text), and `parse` must give None whenever a line
holding "batch" is not such a row. Checked on the real SGLang lines of tests/data/samples, on a
generated backlog, and on every one-byte change of canonical lines.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from specwatch.sources.sglang_columns import parse
from specwatch.sources.sglang_log import _CANONICAL_DECODE, _CANONICAL_PREFILL, _timestamp

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
BENCH = Path(__file__).resolve().parents[2] / "bench"


def _body(p: re.Pattern) -> str:
    return p.pattern.split(r"\] ", 1)[1].removesuffix(r"[, \r]*\Z")


REFERENCE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(?:[.,](\d{1,6}))?((?: [A-Z][A-Z_]*\d+)*)\] "
    rf"(?:{_body(_CANONICAL_DECODE)}|{_body(_CANONICAL_PREFILL)})[, \r]*$",
    re.M,
)


def reference(text: str):
    rows = REFERENCE.findall(text)
    return rows if len(rows) == text.count("batch") else None


def same(block: bytes | str, tz=None) -> str:
    """'rows', 'none' (both refuse), or raises AssertionError where they differ."""
    if isinstance(block, str):
        block = block.encode()
    text = block.decode()
    ref = reference(text)
    try:
        cols = parse(block, tz)
    except ValueError:
        with pytest.raises(ValueError):
            [_timestamp(r[0], r[1], tz) for r in ref or ()]
        return "none"
    if ref is None or not ref:
        assert cols is None or not len(cols.dec), text
        return "none"
    assert cols is not None, text
    assert cols.dec.tolist() == [bool(r[3]) for r in ref]
    assert cols.ts.tolist() == [_timestamp(r[0], r[1], tz) for r in ref]
    assert [cols.ranks[i] for i in cols.rank.tolist()] == [r[2][1:] for r in ref]
    assert cols.ranks == list(dict.fromkeys(r[2][1:] for r in ref))
    d = [r for r in ref if r[3]]
    assert cols.running.tolist() == [int(r[3]) for r in d]
    assert cols.queued.tolist() == [int(r[10]) for r in d]
    assert cols.accept.tolist() == [float(r[6]) for r in d]
    assert cols.thr.tolist() == [float(r[9]) for r in d]
    lines = block.split(b"\n")
    assert [block[s:e] for s, e in zip(cols.start.tolist(), cols.end.tolist())] == \
        [line for line in lines if REFERENCE.fullmatch(line.decode())]
    assert cols.other == b"".join(line + b"\n" for line in lines[:-1] if not REFERENCE.fullmatch(line.decode()))
    return "rows"


DECODE = ("[2026-02-23 16:00:00 DP1 TP1] Decode batch, #running-req: 8, #token: 75742, token usage: 0.59, "
          "accept len: 3.34, accept rate: 0.78, cuda graph: True, gen throughput (token/s): 99.18, #queue-req: 1, ")
PREFILL = ("[2026-02-23 16:00:01.123 TP0] Prefill batch, #new-seq: 1, #new-token: 2676, #cached-token: 197, "
           "token usage: 0.07, #running-req: 12, #queue-req: 0, #pending-token: 5, cuda graph: False, "
           "input throughput (token/s): 3291.20")
ACCESS = '[2026-02-23 16:00:01] INFO:     127.0.0.1:39489 - "POST /v1/chat/completions HTTP/1.1" 200 OK'


def test_real_sglang_lines():
    taken = 0
    for path in sorted(SAMPLES.rglob("*")):
        if path.is_file() and path.suffix in (".log", ".txt"):
            data = path.read_bytes()
            data = data[:data.rfind(b"\n") + 1]
            try:
                data.decode()
            except UnicodeDecodeError:
                continue
            taken += same(data) == "rows"
            # each line on its own, and the canonical ones together
            for line in data.splitlines(keepends=True):
                same(line)
    assert taken >= 1  # kimi-k25-eagle3-collapse.log is canonical 0.5.x output


def test_generated_backlog(tmp_path):
    out = tmp_path / "b.log"
    subprocess.run([sys.executable, str(BENCH / "gen_sglang_log.py"), str(out), "2"], check=True,
                   stdout=subprocess.DEVNULL)
    data = out.read_bytes()
    assert same(data) == "rows"
    assert same(data, ZoneInfo("America/New_York")) == "rows"


@pytest.mark.parametrize("line", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_every_one_byte_change(line):
    """Each byte of a canonical line replaced by each of a few characters, or deleted: parse
    takes the block exactly when the regex does, with the same values."""
    rnd = random.Random(5)
    outcomes = set()
    for i in range(len(line)):
        for ch in ("0", "9", ".", ",", " ", "x", "]", "-", ":", "A", "\r", "é", ""):
            changed = line[:i] + ch + line[i + 1:]
            block = "\n".join([ACCESS, DECODE, changed, PREFILL, ""]).encode()
            outcomes.add(same(block))
        if rnd.random() < 0.2:  # and a few inserts
            block = "\n".join([DECODE, line[:i] + "7" + line[i:], ""]).encode()
            outcomes.add(same(block))
    assert outcomes == {"rows", "none"}


def test_forms_read_and_refused():
    assert same((DECODE + "\n") * 3 + "\n" + ACCESS + "\n") == "rows"
    assert same(DECODE.replace(" DP1 TP1", "") + "\n") == "rows"  # no rank tokens
    assert same(DECODE.replace(" DP1 TP1", ".5 DP12 TP3 EP_X7") + "\n") == "rows"
    assert same(DECODE.replace("16:00:00", "16:00:00,123456") + "\n") == "rows"
    assert same(DECODE.replace("16:00:00", "16:00:00.1234567") + "\n") == "none"  # 7 digits
    assert same(DECODE.replace("75742", "1234567890123") + "\n") == "rows"  # 13 digits
    assert same(DECODE.replace("99.18", "123456789.123456") + "\n") == "rows"
    assert same(DECODE.rstrip(", ") + ",\r \n") == "rows"
    assert same(DECODE + "\n" + ACCESS.replace("INFO", "Decode batch") + "\n") == "none"
    assert same(DECODE.replace("Decode batch,", "Decode batch.") + "\n") == "none"  # SGLang <= 0.5.3
    # a request log quoting a decode line: not a row, so the read is refused
    assert same(DECODE + "\n" + f"[2026-02-23 16:00:02] Receive: obj=GenerateReqInput(text='{DECODE}')\n") == "none"
    for bad in ("02-31", "13-01"):  # impossible dates: ValueError, as `_timestamp` raises
        with pytest.raises(ValueError):
            parse((DECODE.replace("02-23", bad) + "\n").encode(), None)
    # parse is stricter than the regex only past these limits (the read then goes per line)
    assert parse((DECODE.replace("75742", "1" * 17) + "\n").encode(), None) is None
    assert reference(DECODE.replace("75742", "1" * 17) + "\n") is not None


def test_stamps_across_a_zone_change():
    """Stamps in the hour a zone's clocks go back (fold) and forward, as `_timestamp` reads them."""
    tz = ZoneInfo("Europe/Berlin")
    lines = []
    for day, hour in (("2026-03-29", 1), ("2026-03-29", 2), ("2026-03-29", 3), ("2026-10-25", 2), ("2026-10-25", 3)):
        for m in (0, 29, 59):
            for s in (0, 30, 59):
                lines.append(DECODE.replace("2026-02-23 16:00:00", f"{day} {hour:02d}:{m:02d}:{s:02d}"))
    assert same(("\n".join(lines) + "\n").encode(), tz) == "rows"


@pytest.mark.parametrize("line", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_a_line_cut_at_every_byte(line):
    """A line cut short (a crash mid-write), last in the read or between others: refused, never
    read past the block."""
    for i in range(len(line) + 1):
        cut = line[:i]
        same("\n".join([DECODE, cut, ""]))
        same("\n".join([DECODE, cut, PREFILL, ""]))
        same(cut + "\n")
