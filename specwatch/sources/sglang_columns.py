"""The canonical SGLang batch lines of one read, parsed in numpy columns (the catch-up path).

`parse` reads a block of complete lines (bytes, each line ending in "\\n") and returns its batch
lines as columns when every line that holds "batch" is a canonical decode or prefill line of
SGLang 0.5.5+ starting its line (`sglang_log._CANONICAL_DECODE` / `_CANONICAL_PREFILL`: field
order of `metrics_reporter.py` / `scheduler_metrics_mixin.py`, 0.5.5-0.5.23), the rows and values
the two regexes give (tests/sources/test_sglang_columns.py checks it); else None, and the
caller takes the general path.

No Python code runs per line: the block is viewed as one little-endian uint64 word at every
byte offset (`_words`), so a label is checked and a number read with a few gathers and integer
operations per field over all rows at once. Numbers equal Python's `int(s)` / `float(s)`: an
integer of up to 15 digits is exact (longer: the read goes the regex way), and a decimal "I.F" is the integer IF (at most 15 digits,
exact in a float) divided by 10**len(F), one correctly rounded IEEE division, as `float` rounds.
"""

from __future__ import annotations

import re
from datetime import tzinfo

import numpy as np

from specwatch.sources.sglang_log import _timestamp

_PAD = bytes(64)
_P10 = np.array([float(10 ** i) for i in range(23)])
_HI = np.uint64(0x8080808080808080)
_RANKS = re.compile(r"(?: [A-Z][A-Z_]*\d+)*")
# The stamp "[YYYY-MM-DD HH:MM:SS": digit columns and literal columns of its 20 bytes.
_STAMP_DIGITS = np.array([1, 2, 3, 4, 6, 7, 9, 10, 12, 13, 15, 16, 18, 19])
_STAMP_LITS = np.array([0, 5, 8, 11, 14, 17])
_STAMP_LIT_VALUES = np.frombuffer(b"[-- ::", np.uint8)

_DECODE = b"Decode batch, #running-req: "
_PREFILL = b"Prefill batch, #new-seq: "
_DECODE_HEAD = np.uint64(int.from_bytes(_DECODE[:8], "little"))  # a batch line's first word
_PREFILL_HEAD = np.uint64(int.from_bytes(_PREFILL[:8], "little"))
# The fields after the first, in order: (the text before the value, the value's kind).
_DECODE_FIELDS = ((b", #token: ", "int"), (b", token usage: ", "float"), (b", accept len: ", "float"),
                  (b", accept rate: ", "float"), (b", cuda graph: ", "bool"),
                  (b", gen throughput (token/s): ", "float"), (b", #queue-req: ", "int"))
_PREFILL_FIELDS = ((b", #new-token: ", "int"), (b", #cached-token: ", "int"), (b", token usage: ", "float"),
                   (b", #running-req: ", "int"), (b", #queue-req: ", "int"),
                   (b", #pending-token: ", "optional int"), (b", cuda graph: ", "bool"),
                   (b", input throughput (token/s): ", "float"))


class Columns:
    """The batch lines of a block, in file order (index: row).

    `start`/`end`: each row's byte offsets in the block (line start,
    its "\\n"); `dec`: decode row?; `ts`: timestamp, seconds since the epoch (as `_timestamp`);
    `rank`: index into `ranks` (the rank tokens without the leading space, "DP0 TP0", in
    first appearance); decode rows only, by decode ordinal: `running`, `queued` (int64),
    `accept` (accept len), `thr` (gen throughput, token/s) (float64). `other`: the block's
    other lines (those that are not rows) joined, for the caller's text checks."""

    __slots__ = ("start", "end", "dec", "ts", "rank", "ranks", "running", "queued", "accept", "thr",
                 "other")


def _words(buf: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, the uint64 word at every byte offset) of `buf` padded with zeros."""
    padded = buf + _PAD
    a = np.frombuffer(padded, np.uint8)
    return a, np.ndarray((len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))


def _lit(w: np.ndarray, p: np.ndarray, text: bytes) -> np.ndarray:
    """Rows whose bytes at `p` are `text`."""
    ok = None
    for i in range(0, len(text), 8):
        part = text[i:i + 8]
        want = np.uint64(int.from_bytes(part, "little"))
        got = w[p + i]
        if len(part) < 8:
            got = got & np.uint64((1 << 8 * len(part)) - 1)
        eq = got == want
        ok = eq if ok is None else ok & eq
    return ok


def _lead_digits(v: np.ndarray) -> np.ndarray:
    """How many of each word's bytes, from its first (lowest), are ASCII digits (0-8)."""
    t = v ^ np.uint64(0x3030303030303030)  # a digit byte becomes 0-9
    # high bit of each byte: not a digit (>= 10 after the xor, or not ASCII); no carry between bytes
    nondigit = (((t & np.uint64(0x7F7F7F7F7F7F7F7F)) + np.uint64(0x7676767676767676)) | t) & _HI
    low = nondigit & (~nondigit + np.uint64(1))  # the first non-digit's high bit, 0 when none
    bit = (low.astype(float).view(np.int64) >> 52) - 1023  # its index (-1023 for 0)
    return np.minimum(((bit - 7) >> 3) & 15, 8)


def _swar(v: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The number written by each word's first k (1-8) bytes, all ASCII digits."""
    v = v << ((8 - k) * 8).astype(np.uint64)  # right-align the digits: zeros before them
    v = ((v & np.uint64(0x0F0F0F0F0F0F0F0F)) * np.uint64(2561)) >> np.uint64(8)
    v = ((v & np.uint64(0x00FF00FF00FF00FF)) * np.uint64(6553601)) >> np.uint64(16)
    return ((v & np.uint64(0x0000FFFF0000FFFF)) * np.uint64(42949672960001)) >> np.uint64(32)


def _full(w: np.ndarray, p: np.ndarray, maybe: np.ndarray, text: bytes) -> np.ndarray:
    """`maybe` (a mask over p) less the rows whose bytes at p are not `text`."""
    at = np.flatnonzero(maybe)
    out = np.zeros(len(p), bool)
    out[at[_lit(w, p[at], text)]] = True
    return out


def _digits(w: np.ndarray, p: np.ndarray) -> np.ndarray:
    """The length of the digit run at each `p` (0-16; 16: maybe longer, not read)."""
    k = _lead_digits(w[p])
    more = k == 8
    if more.any():
        k[more] += _lead_digits(w[p[more] + 8])
    return k


def _uint(w: np.ndarray, p: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The integer of the k (1-16) digits at p, as uint64."""
    first = np.minimum(k, 8)
    out = _swar(w[p], first)
    long = k > 8
    if long.any():
        rest = k[long] - 8
        out[long] = out[long] * _P10[rest].astype(np.uint64) + _swar(w[p[long] + 8], rest)
    return out


class _Bad(Exception):
    """A row that holds "batch" but does not read as a canonical line: the block is not taken."""


def _field(w: np.ndarray, p: np.ndarray, kind: str, want: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Read one value of `kind` at p: (position after it, its values when `want`)."""
    if kind == "bool":
        t = _lit(w, p, b"True")
        f = _lit(w, p, b"False")
        if not (t | f).all():
            raise _Bad
        return p + np.where(t, 4, 5), None
    k = _digits(w, p)
    if kind == "int":
        if not ((k >= 1) & (k < 16)).all():
            raise _Bad
        return p + k, (_uint(w, p, k).astype(np.int64) if want else None)
    # "\d+\.\d+"
    dot = p + k
    f = _digits(w, dot + 1)
    if not ((k >= 1) & (f >= 1) & (k + f <= 15)).all() or not _lit(w, dot, b".").all():
        raise _Bad
    end = dot + 1 + f
    if not want:
        return end, None
    whole = _uint(w, p, k) * _P10[f].astype(np.uint64) + _uint(w, dot + 1, f)
    return end, whole.astype(float) / _P10[f]


def _walk(w: np.ndarray, p: np.ndarray, fields: tuple, wanted: dict) -> tuple[np.ndarray, dict]:
    """Read `fields` from p on: (the position after the last value, {label: values} of `wanted`).
    Raises _Bad when a row does not read so. The labels are checked at the end, in one gather."""
    out = {}
    at, want, mask = [], [], []
    for label, kind in fields:
        if kind == "optional int":
            has = _lit(w, p, label)
            if has.any():
                q, _ = _field(w, p[has] + len(label), "int", False)
                p = p.copy()
                p[has] = q
            continue
        for i in range(0, len(label), 8):
            part = label[i:i + 8]
            at.append(p + i)
            want.append(int.from_bytes(part, "little"))
            mask.append((1 << 8 * len(part)) - 1)
        p, values = _field(w, p + len(label), kind, label in wanted)
        if values is not None:
            out[wanted[label]] = values
    if len(p) and not ((w[np.stack(at, axis=1)] & np.array(mask, np.uint64)) == np.array(want, np.uint64)).all():
        raise _Bad
    return p, out


def _tail_ok(w: np.ndarray, p: np.ndarray, end: np.ndarray) -> bool:
    """Every row's bytes from p to its line end are in `[, \\r]*` (at most 8 of them)."""
    n = end - p
    if not ((n >= 0) & (n <= 8)).all():
        return False
    if not n.any():
        return True
    m = w[p].view(np.uint8).reshape(-1, 8)
    inside = np.arange(8) < n[:, None]
    allowed = (m == 44) | (m == 32) | (m == 13)
    return bool((allowed | ~inside).all())


def _stamped(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Rows at line starts `s` that start with "[YYYY-MM-DD HH:MM:SS"."""
    m = np.stack((w[s], w[s + 8], w[s + 16]), axis=1).view(np.uint8)[:, :20]
    return ((m[:, _STAMP_DIGITS] - 48) <= 9).all(1) & (m[:, _STAMP_LITS] == _STAMP_LIT_VALUES).all(1)


def _seconds(w: np.ndarray, s: np.ndarray, block: bytes, tz: tzinfo | None) -> np.ndarray:
    """`_timestamp` of each row's stamp (at s+1, 19 bytes): called twice per minute of stamps
    (its :00 and :59; a minute whose zone offset changes inside it is called per second), the
    row's seconds added to the minute's start."""
    k1, k2 = w[s + 1], w[s + 9]  # "YYYY-MM-", "DD HH:MM"
    change = np.ones(len(s), bool)
    change[1:] = (k1[1:] != k1[:-1]) | (k2[1:] != k2[:-1])
    at = np.flatnonzero(change)
    secs = (w[s + 18] & np.uint64(0xFFFF)).view(np.uint8).reshape(-1, 8)[:, :2].astype(np.int64) - 48
    sec = secs[:, 0] * 10 + secs[:, 1]
    if len(sec) and sec.max() > 59:
        raise ValueError("second must be in 0..59")  # as `datetime` says
    seen: dict[bytes, float | None] = {}
    starts = []
    for x in s[at].tolist():
        minute = block[x + 1:x + 17]
        v = seen.get(minute, 0)
        if v == 0:
            text = minute.decode()
            v = _timestamp(text + ":00", None, tz)
            if _timestamp(text + ":59", None, tz) - 59 != v:
                v = None
            seen[minute] = v
        starts.append(np.nan if v is None else v)
    base = np.repeat(np.array(starts, dtype=float), np.diff(np.append(at, len(s))))
    out = base + sec
    odd = np.flatnonzero(np.isnan(base))
    for i in odd.tolist():  # a minute with an offset change: each stamp on its own
        x = int(s[i])
        out[i] = _timestamp(block[x + 1:x + 20].decode(), None, tz)
    return out


def _ranks(w: np.ndarray, q: np.ndarray, r: np.ndarray) -> tuple[list[str], np.ndarray] | None:
    """Each row's rank tokens (from q, r bytes long, at most 32) as (texts in first appearance,
    "DP0 TP0"; each row's index into them); None when one is not rank tokens."""
    n = int(r.max()) // 8 + 1 if len(r) else 1  # words that hold the longest
    words = np.stack([w[q + 8 * i] for i in range(n)], axis=1)
    keep = np.arange(8 * n) < r[:, None]  # bytes of the tokens
    words = (words.view(np.uint8) * keep).view(np.uint64)
    key = words[:, 0]
    for i in range(1, n):
        key = key ^ words[:, i] * np.uint64(0x9E3779B97F4A7C15 + 2 * i)
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    inv = inv.ravel()
    if not (words == words[first[inv]]).all():
        return None  # two texts with one key: not read here
    order = np.argsort(first)  # number them in order of first appearance
    code = np.empty(len(order), np.int64)
    code[order] = np.arange(len(order))
    names = []
    for x in first[order].tolist():
        text = words[x].tobytes()[:r[x]].decode("ascii", "replace")
        if not _RANKS.fullmatch(text):
            return None
        names.append(text[1:])
    return names, code[inv]


def parse(block: bytes, tz: tzinfo | None) -> Columns | None:
    """The batch rows of `block` (complete lines, each ending in "\\n") as Columns; None when a
    line holding "batch" is not a canonical batch line starting its line (the regex path decides
    then). Raises ValueError on an impossible date in a row's stamp."""
    a, w = _words(block)
    nl = np.flatnonzero(a[:len(block)] == 10)
    starts = np.empty(len(nl), np.int64)
    starts[:1] = 0
    starts[1:] = nl[:-1] + 1
    ends = nl
    c = Columns()
    # candidates: "[" + stamp + " " or "." or "," or "]" at byte 20
    s = starts[(a[starts] == 91) & (ends - starts > 40)]
    s = s[_stamped(w, s)]
    # after the stamp: an optional fraction, rank tokens, "] "
    q = s + 20
    frac = np.zeros(len(s), np.int64)
    has_frac = (a[q] == 46) | (a[q] == 44)
    flen = np.zeros(len(s), np.int64)
    if has_frac.any():
        fp = q[has_frac] + 1
        k = _digits(w, fp)
        good = (k >= 1) & (k <= 6)
        fk = np.where(good, k, 1)
        flen[has_frac] = np.where(good, fk, -1)
        frac[has_frac] = _uint(w, fp, fk).astype(np.int64)
        q = q.copy()
        q[has_frac] = fp + fk
    # "] " after the rank tokens: at the first row's length for most rows (a server prints tokens
    # of one length), else searched in 32 bytes (rank tokens hold no "]")
    r = np.full(len(q), -1, np.int64)
    if len(q):
        x = int(q[0])
        guess = block.find(b"]", x, x + 32) - x
        if guess >= 0:
            r[a[q + guess] == 93] = guess
        miss = np.flatnonzero(r < 0)
        if len(miss):
            close = np.stack([w[q[miss] + i] for i in range(0, 32, 8)], axis=1).view(np.uint8) == 93
            r[miss] = np.where(close.any(1), np.argmax(close, axis=1), -1)
    msg = q + r + 2
    head = w[msg]
    spaced = (r >= 0) & (a[q + r + 1] == 32) & (flen >= 0)
    isdec = _full(w, msg, spaced & (head == _DECODE_HEAD), _DECODE)
    rows = isdec | _full(w, msg, spaced & (head == _PREFILL_HEAD), _PREFILL)
    s, q, r, msg, frac, flen, isdec = s[rows], q[rows], r[rows], msg[rows], frac[rows], flen[rows], isdec[rows]
    # rank tokens: one regex check per distinct text
    ranks = _ranks(w, q, r)
    if ranks is None:
        return None
    c.ranks, c.rank = ranks
    # the fields
    row_end = np.empty(len(s), np.int64)
    row_index = np.searchsorted(starts, s)
    row_end[:] = ends[row_index]
    try:
        dp, running = _field(w, msg[isdec] + len(_DECODE), "int", True)
        dp, got = _walk(w, dp, _DECODE_FIELDS,
                        {b", accept len: ": "accept", b", gen throughput (token/s): ": "thr", b", #queue-req: ": "queued"})
        pp, _ = _field(w, msg[~isdec] + len(_PREFILL), "int", False)
        pp, _ = _walk(w, pp, _PREFILL_FIELDS, {})
    except _Bad:
        return None
    if not (_tail_ok(w, dp, row_end[isdec]) and _tail_ok(w, pp, row_end[~isdec])):
        return None
    c.running, c.queued, c.accept, c.thr = running, got["queued"], got["accept"], got["thr"]
    ts = _seconds(w, s, block, tz)
    if flen.any():
        f = flen > 0
        ts[f] = ts[f] + frac[f] / _P10[flen[f]]
    c.start, c.end, c.dec, c.ts = s, row_end, isdec, ts
    is_row = np.zeros(len(starts), bool)
    is_row[row_index] = True
    c.other = _others(block, starts, is_row)
    return None if b"batch" in c.other else c


def _others(block: bytes, starts: np.ndarray, is_row: np.ndarray) -> bytes:
    """The lines that are not rows, joined (each keeps its "\\n")."""
    if not is_row.any():
        return block
    edge = np.diff(np.concatenate(([1], is_row.view(np.int8), [1])))
    begin = np.flatnonzero(edge == -1)  # first non-row line of a stretch
    stop = np.flatnonzero(edge == 1)  # the row after it (or the end)
    bounds = np.append(starts, len(block))
    return b"".join(map(block.__getitem__, map(slice, bounds[begin].tolist(), bounds[stop].tolist())))
