"""SGLang log-line formats (docs/sglang-log-lines.md) against `specwatch.engines.sglang.log.parse_line`.

Generated lines come from tests/sglang_lines.py (known values per version and option); real
lines come from tests/data/samples/ (copies of the shared evidence, see SOURCE.md).
"""

from __future__ import annotations

import os
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for sglang_lines

import sglang_lines as g  # noqa: E402

from specwatch.core.events import (  # noqa: E402
    DecodeBatch,
    MalformedLine,
    OtherLine,
    PrefillBatch,
    ServerArgs,
)
from specwatch.engines.sglang.log import parse_line  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
COMPOSE = re.compile(r"sglang-1\s+\| ")


# --- helpers ---------------------------------------------------------------------------------

def check(got, exp: dict, cls) -> None:
    """Every expected value, with its type (bool is not int, int is not float)."""
    assert type(got) is cls, f"expected {cls.__name__}, got {got!r}"
    for key, want in exp.items():
        have = getattr(got, key)
        if key == "timestamp":
            assert have == pytest.approx(want.timestamp(), abs=1e-6), key
        elif key == "fields":
            for name, value in want.items():
                assert have.get(name) == value, f"fields[{name!r}]: {have.get(name)!r} != {value!r}"
        elif want is None:
            assert have is None, f"{key}: {have!r} is not None"
        else:
            assert have == want and type(have) is type(want), f"{key}: {have!r} != {want!r}"


def _ok(fn, *args, **kw) -> bool:
    try:
        fn(*args, **kw)
        return True
    except ValueError:
        return False


def _has_pp(v: str) -> bool:
    return "PP" in g.rank_order(v)


def decode_cases() -> list:
    """(id, version, kwargs) for every version x option combination that changes the layout."""
    out = []
    for v in g.VERSIONS:
        opts: dict[str, dict] = {
            "plain": {},
            "spec": dict(running=8, tokens=37217, usage=0.13, accept_len=2.90, throughput=171.01),
            "collapse": dict(accept_len=1.00, throughput=120.50),
            "big": dict(running=317, tokens=1094261, usage=1.00, queued=655, throughput=14806.57,
                        accept_len=3.87),
            "rank_dp_tp": dict(rank={"DP": 13, "TP": 13}, accept_len=2.58),
            "rank_full": dict(rank=g.full_rank(v, 2), accept_len=2.00),
            "rank_mixed": dict(rank={t: i for i, t in enumerate(g.rank_order(v))}),
            "graph_off": dict(graph_on=False, accept_len=1.05),
            "ray": dict(ray_prefix=True, rank={"TP": 0}),
            "ray_no_ip": dict(ray_prefix="(SGLangEngine pid=35555)"),
            "pd": dict(pd_decode=True, accept_len=2.20),
            "unknown_field": dict(unknown_field="#new-thing-req: 7", accept_len=1.50),
            "swa": dict(hybrid="swa", accept_len=2.10),
            "mamba": dict(hybrid="mamba"),
            "hisparse": dict(hybrid="hisparse", accept_len=2.10),
            "cpu": dict(graph="cpu"),
            "npu": dict(graph="npu", graph_on=False, accept_len=1.80),
            "musa": dict(graph="musa"),
            "ms": dict(ms=7, accept_len=2.40),
            "ms999": dict(ms=999, rank={"DP": 1, "TP": 1}),
            "iter": dict(iteration=51341, accept_len=2.40),
            "mfu": dict(mfu=True, accept_len=2.40),
            "occupancy": dict(occupancy=True),
            "mfu_occupancy": dict(mfu=True, occupancy=True, accept_len=1.02),
            "cap_len": dict(accept_len=2.40, cap_len=3.10),
        }
        if _has_pp(v):
            opts["rank_tp_pp"] = dict(rank={"TP": 3, "PP": 1}, accept_len=2.40)
        if v == "0.4.6":
            opts["rank_default_tp0"] = dict(rank=None)
        # everything this version can print at once
        every = dict(rank=g.full_rank(v, 5), accept_len=2.33, pd_decode=True,
                     unknown_field="waiting-image-req: 0", ray_prefix=True)
        for k, extra in (("ms", 123), ("iteration", 40), ("mfu", True), ("occupancy", True),
                         ("cap_len", 2.90)):
            if _ok(g.decode_line, v, **{k: extra, "accept_len": 2.0}):
                every[k] = extra
        opts["everything"] = every
        for name, kw in opts.items():
            if _ok(g.decode_line, v, **kw):
                out.append((f"{v}-{name}", v, kw))
    return out


def prefill_cases() -> list:
    out = []
    for v in g.VERSIONS:
        opts: dict[str, dict] = {
            "plain": {},
            "cached": dict(new_seq=4, new_token=16384, cached_token=9000, usage=0.67,
                           running=251, queued=655, input_throughput=14806.57),
            "rank_full": dict(rank=g.full_rank(v, 6)),
            "graph_off": dict(graph_on=False),
            "npu": dict(graph="npu"),
            "swa": dict(hybrid="swa"),
            "mamba": dict(hybrid="mamba"),
            "pd": dict(pd_prefill=True),
            "pending": dict(pending_token=4096),
            "replay": dict(replay_token=12),
            "iter": dict(iteration=51342),
            "ms": dict(ms=45),
            "mfu": dict(mfu=True),
            "ray": dict(ray_prefix=True),
            "unknown_field": dict(unknown_field="#optimistic-req: 0"),
        }
        every = dict(rank=g.full_rank(v, 7), pd_prefill=True, ray_prefix=True,
                     unknown_field="#optimistic-req: 0")
        for k, extra in (("ms", 9), ("iteration", 41), ("mfu", True), ("replay_token", 2),
                         ("pending_token", 512), ("graph_on", False)):
            if _ok(g.prefill_line, v, **{k: extra}):
                every[k] = extra
        opts["everything"] = every
        for name, kw in opts.items():
            if _ok(g.prefill_line, v, **kw):
                out.append((f"{v}-{name}", v, kw))
    return out


DECODE = decode_cases()
DECODE_BY_ID = {c[0]: c[2] for c in DECODE}
PREFILL = prefill_cases()
TRAILING_COMMA = [c for c in DECODE if g.decode_line(c[1], **c[2])[0].endswith(", ")]


# --- generator self-checks (no parser) -------------------------------------------------------

REAL = [ln for ln in (SAMPLES / "sglang-public-lines.txt").read_text().split("\n")
        if ln and not ln.startswith("#")]
KIMI = (SAMPLES / "kimi-k25-eagle3-collapse.log").read_text().split("\n")


@pytest.mark.parametrize("line", [
    g.decode_line("0.4.9", ts="2025-05-31 18:31:21", rank={"DP": 0, "TP": 0}, running=8,
                  tokens=37217, usage=0.13, accept_len=2.90, throughput=171.01)[0],
    g.prefill_line("0.5.3.post3", ts="2025-10-22 10:27:56", rank={"TP": 0}, new_token=28,
                   usage=0.0, running=0)[0],
    g.decode_line("0.5.3.post3", ts="2025-10-22 10:27:57", rank={"TP": 0}, running=1, tokens=108,
                  usage=0.0, accept_len=2.17, accept_rate=0.54, throughput=0.39)[0],
    g.decode_line("0.5.6", ts="2025-11-11 04:06:27", running=46, tokens=34901, usage=0.19,
                  graph_on=False, throughput=1447.08)[0],
    g.decode_line("0.5.9", ts="2026-03-17 17:35:07", rank={"DP": 9, "TP": 9}, running=12,
                  tokens=768, usage=0.0, throughput=3.83)[0],
    g.decode_line("0.5.10", ts="2026-04-05 20:02:51", running=32, tokens=11179, usage=0.08,
                  throughput=1635.11)[0],
    g.prefill_line("0.5.10", ts="2026-04-05 20:02:51", running=31)[0],
    g.decode_line("0.5.10", ts="2026-02-23 16:32:38", rank={"TP": 0}, accept_len=1.05,
                  accept_rate=0.21, graph_on=False)[0],
])
def test_generator_reproduces_real_lines(line):
    assert line in REAL or line in KIMI


_START = {  # start of a decode line by version (docs/sglang-log-lines.md §3)
    "period": re.compile(r"Decode batch\. #running-req: "),
    "0.5.4": re.compile(r"Decode batch \[\d+\], #running-req: "),
    "comma": re.compile(r"Decode batch(?: \[\d+\])?, #running-req: "),
}


@pytest.mark.parametrize("case_id,version,kw", DECODE, ids=[c[0] for c in DECODE])
def test_generator_decode_layout(case_id, version, kw):
    line, exp = g.decode_line(version, **kw)
    m = re.match(r"(?:\([\w]+ pid=\d+(?:, ip=[\d.]+)?\) )?\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)"
                 r"(\.\d{3})?((?: [A-Z_]+\d+)*)\] (.*)$", line)
    assert m, line
    assert (m.group(2) is not None) == ("ms" in kw and kw["ms"] is not None)
    if m.group(2):
        assert g.vkey(version) >= g.vkey("0.5.6")
    toks = [re.match(r"([A-Z_]+?)(\d+)$", t).group(1) for t in m.group(3).split()]
    order = g.rank_order(version)
    assert toks == sorted(toks, key=order.index), "rank tokens out of the version's order"
    assert m.group(3).strip() == exp["rank"]
    body = m.group(4)
    if g.vkey(version) <= g.vkey("0.5.3.post3"):
        assert _START["period"].match(body)
    elif version == "0.5.4":
        assert _START["0.5.4"].match(body)
    else:
        assert _START["comma"].match(body)
    if version in ("0.4.6", "0.4.9"):
        assert re.search(r"#queue-req: \d+$", body)
        assert ("graph:" in body) == (version != "0.4.6")
    elif g.vkey(version) < g.vkey("0.5.9"):
        assert re.search(r"#queue-req: \d+, $", body)
    else:
        assert re.search(r"#queue-req: \d+(, [^,]+: [^,]+)*$", body)
    assert ("accept rate:" in body) == (
        kw.get("accept_len") is not None and g.vkey(version) >= g.vkey("0.5.3.post3"))
    assert body.index("#running-req") < body.index("gen throughput") < body.index("#queue-req")


@pytest.mark.parametrize("case_id,version,kw", PREFILL, ids=[c[0] for c in PREFILL])
def test_generator_prefill_layout(case_id, version, kw):
    line, _ = g.prefill_line(version, **kw)
    body = line.split("] ", 1)[1]
    if g.vkey(version) <= g.vkey("0.5.3.post3"):
        assert body.startswith("Prefill batch. #new-seq: ")
    elif version == "0.5.4":
        assert re.match(r"Prefill batch \[\d+\], #new-seq: ", body)
    else:
        assert re.match(r"Prefill batch(?: \[\d+\])?, #new-seq: ", body)
    if version == "0.5.9":
        assert re.search(r"input throughput \(token/s\): [\d.]+, \w+ graph: (True|False)$", body)
    elif g.vkey(version) >= g.vkey("0.5.10"):
        assert re.search(r"graph: (True|False), input throughput \(token/s\): [\d.]+"
                         r"(, est\. prefill TFLOPS/s \(per GPU\): [\d.]+)?$", body)
    elif version in ("0.4.6", "0.4.9"):
        assert re.search(r": [^,]+$", body)  # no trailing comma
    else:
        assert body.endswith(", ") and "graph" not in body
    assert ("#pending-token" in body) == (g.vkey(version) >= g.vkey("0.5.11"))


@pytest.mark.parametrize("kw", [
    dict(version="0.4.6", graph="cuda"), dict(version="0.4.9", rank={"EP": 1}),
    dict(version="0.5.5", rank={"ATTN_CP": 1}), dict(version="0.5.5", ms=1),
    dict(version="0.5.3", accept_len=2.0, accept_rate=0.5), dict(version="0.5.6", graph="npu"),
    dict(version="0.5.9", mfu=True), dict(version="0.5.10", occupancy=True),
    dict(version="0.5.14", graph="musa"), dict(version="0.5.3", iteration=5),
    dict(version="0.4.6", rank={"DP": 0}), dict(version="0.6.0"),
])
def test_generator_refuses_layouts_a_version_never_prints(kw):
    with pytest.raises(ValueError):
        g.decode_line(kw.pop("version"), **kw)


def test_generator_mixed_log_is_deterministic():
    a = list(g.mixed_log("0.5.23", 300, ranks=2, collapse_after=150, seed=3))
    assert a == list(g.mixed_log("0.5.23", 300, ranks=2, collapse_after=150, seed=3))
    assert len(a) == 300
    assert a[0].startswith("[2026-01-01 12:00:00] server_args=ServerArgs(model_path=")


# --- decode lines ----------------------------------------------------------------------------

def _decode_exp(ts, rank, ranks, running, queued, tokens, usage, accept, rate, graph, kind, thr,
                iteration=None, **fields):
    """Expected DecodeBatch values, written out by reading the line (not from the generator)."""
    exp = dict(timestamp=ts, rank=rank, ranks=ranks, running_requests=running,
               queued_requests=queued, forward_iteration=iteration, accept_length=accept,
               accept_rate=rate, graph_enabled=graph, graph_kind=kind, gen_throughput=thr)
    if tokens is not None:
        exp.update(num_tokens=tokens, token_usage=usage)
    if fields:
        exp["fields"] = {k.replace("_", " "): v for k, v in fields.items()}
    return exp


NOON = datetime(2026, 1, 1, 12, 0)
# One line per layout that changes parsing (version x option), with its values read off the text.
DECODE_LITERAL = [
    ("0.4.6-spec", "[2026-01-01 12:00:00 TP0] Decode batch. #running-req: 8, #token: 37217, token usage: "
     "0.13, accept len: 2.90, gen throughput (token/s): 171.01, #queue-req: 0",
     _decode_exp(NOON, "TP0", {"TP": 0}, 8, 0, 37217, 0.13, 2.9, None, None, None, 171.01)),
    ("0.4.9-everything", "(SGLangEngine pid=111711, ip=10.15.36.1) [2026-01-01 12:00:00 DP5 TP5 PP5] Decode "
     "batch. #running-req: 32, #token: 2268, token usage: 0.02, accept len: 2.33, pre-allocated usage: 0.05, "
     "#retracted-req: 0, waiting-image-req: 0, cuda graph: True, gen throughput (token/s): 400.57, "
     "#queue-req: 0",
     _decode_exp(NOON, "DP5 TP5 PP5", {"DP": 5, "TP": 5, "PP": 5}, 32, 0, 2268, 0.02, 2.33, None, True,
                 "cuda", 400.57, **{"pre-allocated_usage": "0.05", "waiting-image-req": "0"})),
    ("0.5.3.post3-rank_dp_tp", "[2026-01-01 12:00:00 DP13 TP13] Decode batch. #running-req: 32, #token: 2268, "
     "token usage: 0.02, accept len: 2.58, accept rate: 0.65, cuda graph: True, gen throughput (token/s): "
     "400.57, #queue-req: 0, ",
     _decode_exp(NOON, "DP13 TP13", {"DP": 13, "TP": 13}, 32, 0, 2268, 0.02, 2.58, 0.65, True, "cuda",
                 400.57)),
    ("0.5.4-iter", "[2026-01-01 12:00:00] Decode batch [51341], #running-req: 32, #token: 2268, token usage: "
     "0.02, accept len: 2.40, accept rate: 0.60, cuda graph: True, gen throughput (token/s): 400.57, "
     "#queue-req: 0, ",
     _decode_exp(NOON, "", {}, 32, 0, 2268, 0.02, 2.4, 0.6, True, "cuda", 400.57, iteration=51341)),
    ("0.5.6-graph_off", "[2026-01-01 12:00:00] Decode batch, #running-req: 32, #token: 2268, token usage: 0.02, "
     "accept len: 1.05, accept rate: 0.26, cuda graph: False, gen throughput (token/s): 400.57, "
     "#queue-req: 0, ",
     _decode_exp(NOON, "", {}, 32, 0, 2268, 0.02, 1.05, 0.26, False, "cuda", 400.57)),
    ("0.5.6-ray_no_ip", "(SGLangEngine pid=35555) [2026-01-01 12:00:00] Decode batch, #running-req: 32, "
     "#token: 2268, token usage: 0.02, cuda graph: True, gen throughput (token/s): 400.57, #queue-req: 0, ",
     _decode_exp(NOON, "", {}, 32, 0, 2268, 0.02, None, None, True, "cuda", 400.57)),
    ("0.5.9-everything", "(SGLangEngine pid=111711, ip=10.15.36.1) [2026-01-01 12:00:00.123 DP5 PP5 ATTN_CP5 "
     "MOE_DP5 TP5 EP5] Decode batch [40], #running-req: 32, #token: 2268, token usage: 0.02, accept len: "
     "2.33, accept rate: 0.58, pre-allocated usage: 0.05, #prealloc-req: 2, #transfer-req: 1, "
     "#retracted-req: 0, waiting-image-req: 0, cuda graph: True, gen throughput (token/s): 400.57, "
     "#queue-req: 0",
     _decode_exp(datetime(2026, 1, 1, 12, 0, 0, 123000), "DP5 PP5 ATTN_CP5 MOE_DP5 TP5 EP5",
                 {"DP": 5, "PP": 5, "ATTN_CP": 5, "MOE_DP": 5, "TP": 5, "EP": 5}, 32, 0, 2268, 0.02, 2.33,
                 0.58, True, "cuda", 400.57, iteration=40, **{"#prealloc-req": "2", "#transfer-req": "1"})),
    ("0.5.10-npu", "[2026-01-01 12:00:00] Decode batch, #running-req: 32, #token: 2268, token usage: 0.02, "
     "accept len: 1.80, accept rate: 0.45, npu graph: False, gen throughput (token/s): 400.57, #queue-req: 0",
     _decode_exp(NOON, "", {}, 32, 0, 2268, 0.02, 1.8, 0.45, False, "npu", 400.57)),
    ("0.5.23-everything", "(SGLangEngine pid=111711, ip=10.15.36.1) [2026-01-01 12:00:00.123 DP5 PP5 ATTN_CP5 "
     "MOE_DP5 TP5 EP5] Decode batch [40], #running-req: 32, #token: 2268, token usage: 0.02, accept len: "
     "2.33, accept rate: 0.44, cap len: 2.90, pre-allocated usage: 0.05, #prealloc-req: 2, #transfer-req: 1, "
     "#retracted-req: 0, waiting-image-req: 0, cuda graph: True, gen throughput (token/s): 400.57, "
     "#queue-req: 0, est. decode TFLOPS/s (per GPU): 118.42, est. read BW (GB/s per GPU): 2931.07, est. "
     "write BW (GB/s per GPU): 14.66, device timer fwd (ms): 21.37",
     _decode_exp(datetime(2026, 1, 1, 12, 0, 0, 123000), "DP5 PP5 ATTN_CP5 MOE_DP5 TP5 EP5",
                 {"DP": 5, "PP": 5, "ATTN_CP": 5, "MOE_DP": 5, "TP": 5, "EP": 5}, 32, 0, 2268, 0.02, 2.33,
                 0.44, True, "cuda", 400.57, iteration=40,
                 **{"cap_len": "2.90", "device_timer_fwd_(ms)": "21.37"})),
    ("0.5.23-ms999", "[2026-01-01 12:00:00.999 DP1 TP1] Decode batch, #running-req: 32, #token: 2268, token "
     "usage: 0.02, cuda graph: True, gen throughput (token/s): 400.57, #queue-req: 0",
     _decode_exp(datetime(2026, 1, 1, 12, 0, 0, 999000), "DP1 TP1", {"DP": 1, "TP": 1}, 32, 0, 2268, 0.02,
                 None, None, True, "cuda", 400.57)),
    ("0.5.23-swa", "[2026-01-01 12:00:00] Decode batch, #running-req: 32, #full token: 2268, full token usage: "
     "0.02, #swa token: 283, swa token usage: 0.00, accept len: 2.10, accept rate: 0.37, cuda graph: True, "
     "gen throughput (token/s): 400.57, #queue-req: 0",
     _decode_exp(NOON, "", {}, 32, 0, None, None, 2.1, 0.37, True, "cuda", 400.57,
                 **{"#full_token": "2268", "#swa_token": "283"})),
    ("0.5.23-mamba", "[2026-01-01 12:00:00] Decode batch, #running-req: 32, #full token: 2268, full token "
     "usage: 0.02, mamba num: 12, mamba usage: 0.04, cuda graph: True, gen throughput (token/s): 400.57, "
     "#queue-req: 0",
     _decode_exp(NOON, "", {}, 32, 0, None, None, None, None, True, "cuda", 400.57,
                 **{"mamba_num": "12", "mamba_usage": "0.04"})),
    ("0.5.23-hisparse", "[2026-01-01 12:00:00] Decode batch, #running-req: 32, #token: 2268, token usage: 0.02, "
     "#gpu token: 567, gpu token usage: 0.01, #cpu token: 1701, cpu token usage: 0.01, accept len: 2.10, "
     "accept rate: 0.37, cuda graph: True, gen throughput (token/s): 400.57, #queue-req: 0",
     _decode_exp(NOON, "", {}, 32, 0, 2268, 0.02, 2.1, 0.37, True, "cuda", 400.57,
                 **{"#cpu_token": "1701"})),
    ("0.5.23-unknown_field", "[2026-01-01 12:00:00] Decode batch, #running-req: 32, #token: 2268, token usage: "
     "0.02, accept len: 1.50, accept rate: 0.17, #new-thing-req: 7, cuda graph: True, gen throughput "
     "(token/s): 400.57, #queue-req: 0",
     _decode_exp(NOON, "", {}, 32, 0, 2268, 0.02, 1.5, 0.17, True, "cuda", 400.57,
                 **{"#new-thing-req": "7"})),
    ("0.5.23-cpu", "[2026-01-01 12:00:00] Decode batch, #running-req: 32, #token: 2268, token usage: 0.02, "
     "cpu graph: True, gen throughput (token/s): 400.57, #queue-req: 0",
     _decode_exp(NOON, "", {}, 32, 0, 2268, 0.02, None, None, True, "cpu", 400.57)),
    ("0.5.23-big", "[2026-01-01 12:00:00] Decode batch, #running-req: 317, #token: 1094261, token usage: 1.00, "
     "accept len: 3.87, accept rate: 0.96, cuda graph: True, gen throughput (token/s): 14806.57, "
     "#queue-req: 655",
     _decode_exp(NOON, "", {}, 317, 655, 1094261, 1.0, 3.87, 0.96, True, "cuda", 14806.57)),
]


@pytest.mark.parametrize("case_id,line,exp", DECODE_LITERAL, ids=[c[0] for c in DECODE_LITERAL])
def test_decode_line(case_id, line, exp):
    check(parse_line(line), exp, DecodeBatch)
    version, _, name = case_id.partition("-")  # the generator writes exactly this line
    assert g.decode_line(version, **DECODE_BY_ID[case_id])[0] == line


@pytest.mark.parametrize("case_id,version,kw", DECODE, ids=[c[0] for c in DECODE])
def test_decode_line_container_prefix(case_id, version, kw):
    line, exp = g.decode_line(version, **kw)
    check(parse_line(g.with_container_prefix(line), container_prefix=COMPOSE), exp, DecodeBatch)


@pytest.mark.parametrize("case_id,version,kw", TRAILING_COMMA, ids=[c[0] for c in TRAILING_COMMA])
def test_decode_line_trailing_comma_without_space(case_id, version, kw):
    # 0.4.10-0.5.8 end in ", "; copies and collectors often strip the trailing space
    line, exp = g.decode_line(version, **kw)
    check(parse_line(line.rstrip()), exp, DecodeBatch)


CUT_LINES = [
    g.decode_line("0.5.23", **dict(DECODE_BY_ID["0.5.23-everything"]))[0],
    g.decode_line("0.5.6", rank={"DP": 0, "PP": 1, "TP": 2}, accept_len=1.00)[0],
    g.decode_line("0.4.9", hybrid="swa", rank={"TP": 1}, accept_len=2.5)[0],
    g.prefill_line("0.5.9", rank={"DP": 1, "TP": 1})[0],
    g.prefill_line("0.5.23", mfu=True, replay_token=3)[0],
]


@pytest.mark.parametrize("line", CUT_LINES, ids=[f"cut{i}" for i in range(len(CUT_LINES))])
def test_every_truncation_of_a_batch_line(line):
    # column-truncated copies (docs/sglang-log-lines.md §3, last item): never raise; without a
    # complete #queue-req it is malformed
    kind = DecodeBatch if "Decode batch" in line else PrefillBatch
    start = line.index(" batch") + len(" batch") + 2
    for i in range(len(line) + 1):
        cut = line[:i]
        got = parse_line(cut)
        assert type(got) in (kind, MalformedLine, OtherLine), f"{cut!r} -> {got!r}"
        if i >= start and not re.search(r"#queue-req: \d", cut):
            assert type(got) is MalformedLine, f"{cut!r} -> {got!r}"


@pytest.mark.parametrize("prefix", ["sglang-1  | ", "specwatch-sglang-decode-1  | ", "sglang_1 | ",
                                    "\x1b[36msglang-1  |\x1b[0m "])  # `docker compose logs` on a terminal
def test_compose_prefix_recognised_without_configuration(prefix):
    # docs/sglang-log-lines.md §6: strip a container prefix (configured, or recognised)
    line, exp = g.decode_line("0.5.23", rank={"DP": 1, "TP": 1}, accept_len=1.05, ms=250)
    check(parse_line(g.with_container_prefix(line, prefix)), exp, DecodeBatch)


def test_timestamp_is_local_time(monkeypatch):
    # naive log time read in the local zone, DST included (distinct stamps: parsers may cache)
    cases = [("UTC", "2026-07-01 09:30:00"), ("America/New_York", "2026-07-01 09:30:01"),
             ("America/New_York", "2026-01-15 09:30:02"), ("Asia/Kolkata", "2026-07-01 09:30:03")]
    for tz, ts in cases:
        line, exp = g.decode_line("0.5.23", ts=ts, ms=500, accept_len=2.0)
        monkeypatch.setenv("TZ", tz)
        time.tzset()
        try:
            got = parse_line(line)
            assert got.timestamp == pytest.approx(exp["timestamp"].timestamp(), abs=1e-6), tz
        finally:
            monkeypatch.undo()
            time.tzset()


# --- prefill lines ---------------------------------------------------------------------------

@pytest.mark.parametrize("case_id,version,kw", PREFILL, ids=[c[0] for c in PREFILL])
def test_prefill_line(case_id, version, kw):
    line, exp = g.prefill_line(version, **kw)
    check(parse_line(line), exp, PrefillBatch)


@pytest.mark.parametrize("case_id,version,kw", PREFILL, ids=[c[0] for c in PREFILL])
def test_prefill_line_container_prefix(case_id, version, kw):
    line, exp = g.prefill_line(version, **kw)
    check(parse_line(g.with_container_prefix(line), container_prefix=COMPOSE), exp, PrefillBatch)


# --- server_args -----------------------------------------------------------------------------

SERVER_ARGS = {
    "eagle3": {},
    "no_spec": dict(speculative_algorithm=None, speculative_draft_model_path=None,
                    speculative_num_steps=None, speculative_eagle_topk=None,
                    speculative_num_draft_tokens=None),
    "eagle_topk8": dict(speculative_algorithm="EAGLE", speculative_num_steps=5,
                        speculative_eagle_topk=8, speculative_num_draft_tokens=32,
                        decode_log_interval=10),
    "odd_path": dict(model_path="/data/models/Qwen3-235B-A22B (fp8), v2",
                     speculative_draft_model_path="/data/drafts/eagle3=v1, final (2)"),
    "ms": dict(ms=81),
}


@pytest.mark.parametrize("name", list(SERVER_ARGS))
@pytest.mark.parametrize("prefixed", [False, True], ids=["bare", "container"])
def test_server_args_line(name, prefixed):
    line, exp = g.server_args_line(**SERVER_ARGS[name])
    got = parse_line(g.with_container_prefix(line) if prefixed else line,
                     container_prefix=COMPOSE if prefixed else None)
    assert type(got) is ServerArgs, got
    assert got.timestamp == pytest.approx(exp.pop("timestamp").timestamp(), abs=1e-6)
    for key, want in exp.items():
        assert key in got.args, key
        have = got.args[key]
        assert have == want and type(have) is type(want), f"{key}: {have!r} != {want!r}"
    assert got.speculative_algorithm == exp["speculative_algorithm"]


# --- other and malformed lines ---------------------------------------------------------------

OTHER = g.other_lines()


@pytest.mark.parametrize("line", OTHER, ids=[f"other{i}" for i in range(len(OTHER))])
def test_other_line(line):
    assert type(parse_line(line)) is OtherLine, line
    assert type(parse_line(g.with_container_prefix(line), container_prefix=COMPOSE)) is OtherLine


@pytest.mark.parametrize("line", g.request_log_lines())
def test_request_log_with_decode_text_is_not_a_decode_batch(line):
    assert "Decode batch, #running-req: 9" in line
    got = parse_line(line)
    assert not isinstance(got, (DecodeBatch, PrefillBatch, MalformedLine)), got
    assert type(got) is OtherLine


MALFORMED = g.malformed_lines()


@pytest.mark.parametrize("line", MALFORMED, ids=[f"malformed{i}" for i in range(len(MALFORMED))])
def test_malformed_line(line):
    got = parse_line(line)
    assert type(got) is MalformedLine, f"{line!r} -> {got!r}"
    assert got.reason
    got = parse_line(g.with_container_prefix(line), container_prefix=COMPOSE)
    assert type(got) is MalformedLine, f"{line!r} -> {got!r}"


# --- mixed log -------------------------------------------------------------------------------

@pytest.mark.parametrize("version", g.VERSIONS)
def test_mixed_log_parses(version):
    lines = list(g.mixed_log(version, 400, ranks=2, collapse_after=200, seed=1,
                             container_prefix="sglang-1  | "))
    parsed = [parse_line(ln, container_prefix=COMPOSE) for ln in lines]
    assert not [ln for ln, p in zip(lines, parsed) if isinstance(p, MalformedLine)]
    assert type(parsed[0]) is ServerArgs and parsed[0].speculative_algorithm == "EAGLE3"
    decodes = [(i, p) for i, p in enumerate(parsed) if isinstance(p, DecodeBatch)]
    assert {p.rank for _, p in decodes} == {"DP0 TP0", "DP1 TP1"}
    assert all(p.accept_length >= 2.4 for i, p in decodes if i < 200)
    # collapse starts with the first interval (one line per rank) emitted at line 200 or later
    assert all(1.0 <= p.accept_length <= 1.06 for i, p in decodes if i >= 200 + 1)
    assert any(isinstance(p, PrefillBatch) for p in parsed)
    assert sum(isinstance(p, OtherLine) for p in parsed) > 10


# --- real lines ------------------------------------------------------------------------------

def _d(ts, rank, running, tokens, usage, graph, thr, queued, accept=None, rate=None):
    ranks = {m.group(1): int(m.group(2)) for m in re.finditer(r"([A-Z_]+?)(\d+)", rank)}
    return DecodeBatch, dict(
        timestamp=datetime.fromisoformat(ts), rank=rank, ranks=ranks, running_requests=running,
        num_tokens=tokens, token_usage=usage, accept_length=accept, accept_rate=rate,
        graph_enabled=graph, graph_kind="cuda" if graph is not None else None,
        gen_throughput=thr, queued_requests=queued, forward_iteration=None)


def _p(ts, rank, seq, new, cached, usage, running, queued, graph=None, thr=None):
    ranks = {m.group(1): int(m.group(2)) for m in re.finditer(r"([A-Z_]+?)(\d+)", rank)}
    return PrefillBatch, dict(
        timestamp=datetime.fromisoformat(ts), rank=rank, ranks=ranks, new_seq=seq,
        new_token=new, cached_token=cached, token_usage=usage, running_requests=running,
        queued_requests=queued, graph_enabled=graph,
        graph_kind="cuda" if graph is not None else None, input_throughput=thr,
        forward_iteration=None)


OTHER_REAL = (OtherLine, {})

# One entry per non-comment line of sglang-public-lines.txt, in file order.
PUBLIC_EXPECTED = [
    ("2777 access", OTHER_REAL),
    ("2777 prefill 1", _p("2025-01-07 20:16:02", "TP0", 1, 48, 0, 0.00, 0, 0)),
    ("2777 prefill 2", _p("2025-01-07 20:16:02", "TP0", 1, 75, 0, 0.01, 1, 62)),
    ("3582 traceback", OTHER_REAL),
    ("4058 MLA", OTHER_REAL),
    ("4058 init", OTHER_REAL),
    ("4407 access", OTHER_REAL),
    ("6081 DP0", _d("2025-05-31 18:31:21", "DP0 TP0", 8, 37217, 0.13, True, 171.01, 0, 2.90)),
    ("6081 DP6", _d("2025-05-31 18:31:21", "DP6 TP6", 8, 36267, 0.12, True, 168.28, 0, 2.86)),
    ("6081 DP5", _d("2025-05-31 18:31:21", "DP5 TP5", 8, 37565, 0.13, True, 173.06, 0, 2.94)),
    ("6081 DP2", _d("2025-05-31 18:31:25", "DP2 TP2", 8, 37787, 0.13, True, 152.08, 0, 2.58)),
    ("11948 prefill", _p("2025-10-22 10:27:56", "TP0", 1, 28, 0, 0.00, 0, 0)),
    ("11948 decode 1", _d("2025-10-22 10:27:57", "TP0", 1, 108, 0.00, True, 0.39, 0, 2.17, 0.54)),
    ("11948 decode 2", _d("2025-10-22 10:27:58", "TP0", 1, 258, 0.00, True, 165.41, 0, 1.80, 0.45)),
    ("13023 decode 1", _d("2025-11-11 04:06:27", "", 46, 34901, 0.19, False, 1447.08, 0)),
    ("13023 decode 2", _d("2025-11-11 04:06:30", "", 28, 22920, 0.13, True, 1086.59, 0)),
    ("14496 traceback", OTHER_REAL),
    ("20766 DP9", _d("2026-03-17 17:35:07", "DP9 TP9", 12, 768, 0.00, True, 3.83, 0)),
    ("20766 DP13", _d("2026-03-17 17:35:07", "DP13 TP13", 12, 768, 0.00, True, 3.83, 0)),
    ("22166 decode", _d("2026-04-05 20:02:51", "", 32, 11179, 0.08, True, 1635.11, 0)),
    ("22166 access", OTHER_REAL),
    ("22166 prefill", _p("2026-04-05 20:02:51", "", 1, 158, 0, 0.08, 31, 0, True, 559.53)),
    ("22331 decode", _d("2026-04-08 14:05:21", "TP0", 5, 20800, 0.29, True, 144.95, 0)),
]


def test_public_lines_count():
    assert len(REAL) == len(PUBLIC_EXPECTED)


@pytest.mark.parametrize("idx", range(len(PUBLIC_EXPECTED)),
                         ids=[e[0] for e in PUBLIC_EXPECTED])
def test_public_line(idx):
    cls, exp = PUBLIC_EXPECTED[idx][1]
    check(parse_line(REAL[idx]), exp, cls)
    check(parse_line(g.with_container_prefix(REAL[idx]), container_prefix=COMPOSE), exp, cls)


@pytest.mark.parametrize("idx,ts,tokens,usage,accept,thr", [
    (0, "2026-02-23 16:32:38", 2268, 0.02, 1.05, 400.57),
    (1, "2026-02-23 16:32:42", 3622, 0.03, 1.06, 385.45),
])
def test_kimi_collapse_lines(idx, ts, tokens, usage, accept, thr):
    cls, exp = _d(ts, "TP0", 32, tokens, usage, False, thr, 0, accept, 0.21)
    check(parse_line(KIMI[idx]), exp, cls)


def _br_lines(name: str) -> list[str]:
    return [ln for ln in (SAMPLES / "bugreport-logs" / name).read_text().split("\n")
            if ln and not ln.startswith("#")]


def test_br01_truncated_decode_line_is_malformed():
    line = _br_lines("BR-01.log")[-1]
    assert line == "[2025-11-19 15:25:25] Decode batch, #running-req: 1, #token: 353, token usage:"
    got = parse_line(line)
    assert type(got) is MalformedLine, got
    assert got.reason and got.rank == ""
    if got.timestamp is not None:
        assert got.timestamp == pytest.approx(datetime(2025, 11, 19, 15, 25, 25).timestamp())


BR_OTHER = [(f, ln) for f in sorted(os.listdir(SAMPLES / "bugreport-logs")) if f.endswith(".log")
            for ln in _br_lines(f) if "Decode batch" not in ln and "Prefill batch" not in ln
            and "] server_args=ServerArgs(" not in ln]


@pytest.mark.parametrize("name,line", BR_OTHER, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BR_OTHER)])
def test_bugreport_non_sglang_lines_are_other(name, line):
    # vLLM / TensorRT-LLM / benchmark output: not SGLang batch lines (SGLang reports: their
    # server_args line is read as settings, tests/rules/test_collapse_advice.py)
    assert type(parse_line(line)) is OtherLine, line


def test_canonical_fast_paths_build_the_events_of_the_general_path(monkeypatch):
    """The one-match readers of the common decode and prefill lines return exactly what the
    general field-by-field path returns, for every generated case and real sample line."""
    import specwatch.engines.sglang.log as sl

    lines = [g.decode_line(v, **kw)[0] for _, v, kw in decode_cases()]
    lines += [g.prefill_line(v, **kw)[0] for _, v, kw in prefill_cases()]
    lines += [l for p in sorted(SAMPLES.rglob("*.log")) + [SAMPLES / "sglang-public-lines.txt"]
              for l in p.read_text(errors="replace").splitlines()]
    lines += [l + suffix for l in lines[:200] for suffix in (", ", "\r", " x")]  # trailing bytes
    fast = [parse_line(l) for l in lines]
    hits = sum(bool(sl._CANONICAL_DECODE.match(l) or sl._CANONICAL_PREFILL.match(l)) for l in lines)
    never = re.compile(r"(?!)")
    monkeypatch.setattr(sl, "_CANONICAL_DECODE", never)
    monkeypatch.setattr(sl, "_CANONICAL_PREFILL", never)
    slow = [parse_line(l) for l in lines]
    assert hits >= 50  # the fast paths were taken
    for line, a, b in zip(lines, fast, slow):
        assert a == b, line


def test_timestamp_cache_stays_small_over_hours_of_lines():
    """Issue 10 item 23: a cache of parsed seconds grew for 68 minutes of log before each clear."""
    from datetime import timezone

    from specwatch.engines.sglang import log as sglang_log

    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc).timestamp()
    for s in range(0, 7200, 7):  # two hours of log, one line every 7 s
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0 + s))
        ev = parse_line(g.decode_line("0.5.23", ts=stamp)[0], tz=timezone.utc)
        assert ev.timestamp == t0 + s
        assert len(sglang_log._ts_cache) <= sglang_log._TS_CACHE_MAX == 64


def test_impossible_numbers_are_malformed_not_values():
    """`accept len: nan`, a negative value or an overflow are a garbled line (never NaN in /metrics
    or in `replay --json`)."""
    base = ("[2026-02-23 16:32:38 TP0] Decode batch, #running-req: 32, #token: 2268, token usage: 0.02, "
            "accept len: {al}, accept rate: 0.21, cuda graph: False, gen throughput (token/s): {thr}, #queue-req: 0")
    for al, thr in (("nan", "400.57"), ("-5", "400.57"), ("inf", "400.57"), ("1.05", "1e400"), ("1.05", "-1.00")):
        ev = parse_line(base.format(al=al, thr=thr))
        assert type(ev) is MalformedLine and "unreadable value" in ev.reason, (al, thr, ev)
    assert parse_line(base.format(al="1.05", thr="400.57")).accept_length == 1.05
