"""Generator of SGLang log lines with known values, one variant per format SGLang printed (0.4.6 to 0.5.23).

Every builder returns `(line, expected)`; `expected` uses the attribute names of the events in
`specwatch.core.events` (`timestamp` is the naive local `datetime` the line encodes; `fields` is the
subset of `name: value` pairs, as printed text, that the line must yield).
Formats follow docs/sglang-log-lines.md (version → layout; the § numbers below are its sections);
real lines that the generator reproduces byte for byte are checked in
tests/sources/test_sglang_log_formats.py.

    python tests/sglang_lines.py --version 0.5.23 --lines 1000 --ranks 2 --collapse-after 500
"""

from __future__ import annotations

import math

import argparse
import json
import os
import random
import sys
from datetime import datetime, timedelta

VERSIONS = (
    "0.4.6", "0.4.9", "0.4.10", "0.5.3", "0.5.3.post3", "0.5.4", "0.5.5", "0.5.6",
    "0.5.9", "0.5.10", "0.5.14", "0.5.18", "0.5.23",
)
GRAPH_KINDS = ("cuda", "cpu", "npu", "musa")
_DEFAULT = object()  # "what this version prints by default"


def vkey(version: str) -> tuple[int, int, int, int]:
    """'0.5.3.post3' -> (0, 5, 3, 3). '0.4.6' stands for 0.4.6.post1, '0.4.10' for 0.4.10.post2."""
    parts = version.split(".")
    post = 0
    if len(parts) == 4:
        post = int(parts[3].removeprefix("post"))
    return (int(parts[0]), int(parts[1]), int(parts[2]), post)


def _ge(version: str, other: str) -> bool:
    return vkey(version) >= vkey(other)


def _check_version(version: str) -> None:
    if version not in VERSIONS:
        raise ValueError(f"unsupported version {version!r}; one of {VERSIONS}")


# --- prefix (§2) ---------------------------------------------------------------------------

def rank_order(version: str) -> tuple[str, ...]:
    """Rank tokens in the order this version prints them (§2 table)."""
    if version == "0.4.6":
        return ("DP", "TP")
    if version == "0.4.9":
        return ("DP", "TP", "PP")
    if not _ge(version, "0.5.6"):
        return ("DP", "TP", "EP", "PP")
    if not _ge(version, "0.5.9"):
        return ("DP", "PP", "TP", "EP")
    return ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP")


def full_rank(version: str, n: int = 1) -> dict[str, int]:
    """Every token this version can print, all with value n (a big multi-axis deployment)."""
    return {tok: n for tok in rank_order(version)}


def _rank_text(version: str, rank: dict[str, int] | None) -> tuple[str, dict[str, int]]:
    if rank is None:
        # 0.4.6.post1 always prints TP; since 0.4.9 a single GPU has no token at all
        rank = {"TP": 0} if version == "0.4.6" else {}
    order = rank_order(version)
    unknown = set(rank) - set(order)
    if unknown:
        raise ValueError(f"{version} never prints rank tokens {sorted(unknown)}")
    if version == "0.4.6" and "TP" not in rank:
        raise ValueError("0.4.6 always prints TP")
    toks = [f"{t}{rank[t]}" for t in order if t in rank]
    return " ".join(toks), {t: rank[t] for t in order if t in rank}


def _prefix(version: str, ts: str, ms: int | None, rank: dict[str, int] | None,
            ray_prefix: str | bool | None) -> tuple[str, dict]:
    dt = datetime.strptime(ts, "%Y-%m-%d %H:%M:%S")
    stamp = ts
    if ms is not None:
        if not _ge(version, "0.5.6"):
            raise ValueError("SGLANG_LOG_MS exists since 0.5.6")
        stamp = f"{ts}.{ms:03d}"
        dt = dt.replace(microsecond=ms * 1000)
    rank_s, ranks = _rank_text(version, rank)
    head = f"[{stamp}{' ' + rank_s if rank_s else ''}] "
    if ray_prefix:
        if ray_prefix is True:
            ray_prefix = "(SGLangEngine pid=111711, ip=10.15.36.1)"
        head = f"{ray_prefix} {head}"
    return head, {"timestamp": dt, "rank": rank_s, "ranks": ranks}


def _start(version: str, kind: str, iteration: int | None) -> tuple[str, int | None]:
    """'Decode batch. ' / 'Decode batch [n], ' / 'Decode batch, ' (§3, §5)."""
    if not _ge(version, "0.5.4"):
        if iteration is not None:
            raise ValueError(f"{version} prints no forward iteration")
        return f"{kind} batch. ", None
    if version == "0.5.4":
        it = 1200 if iteration is None else iteration  # always printed in 0.5.4
        return f"{kind} batch [{it}], ", it
    if iteration is not None:  # SGLANG_LOG_FORWARD_ITERS
        return f"{kind} batch [{iteration}], ", iteration
    return f"{kind} batch, ", None


def _graph(version: str, graph, graph_on: bool, parts: list, fields: dict, exp: dict) -> None:
    if graph is _DEFAULT:
        graph = None if version == "0.4.6" else "cuda"
    if graph is None:
        if not graph_on:
            raise ValueError("graph_on=False needs a printed graph flag")
        exp.update(graph_enabled=None, graph_kind=None)
        return
    if version == "0.4.6":
        raise ValueError("0.4.6.post1 prints no graph flag")
    if graph not in GRAPH_KINDS:
        raise ValueError(f"graph must be one of {GRAPH_KINDS}")
    if graph == "cpu" and not _ge(version, "0.5.3"):
        raise ValueError("'cpu graph' label from 0.5.2/0.5.3 on")
    if graph == "npu" and not _ge(version, "0.5.9"):
        raise ValueError("'npu graph' from 0.5.9 on (0.5.3-0.5.8 print 'cpu graph' on NPU)")
    if graph == "musa" and version != "0.5.23":
        raise ValueError("'musa graph' in 0.5.23 only")
    _add(parts, fields, f"{graph} graph", str(graph_on))
    exp.update(graph_enabled=graph_on, graph_kind=graph)


def _add(parts: list, fields: dict | None, name: str, value: str) -> None:
    parts.append(f"{name}: {value}")
    if fields is not None:
        fields[name] = value


def _f2(x: float) -> str:
    return f"{x:.2f}"


def default_accept_rate(version: str, accept_len: float, num_steps: int = 3,
                        num_draft_tokens: int = 4) -> float | None:
    """accept rate as each version computes it from accept len (§4), topk=1."""
    if not _ge(version, "0.5.3.post3"):
        return None
    if not _ge(version, "0.5.6"):
        return accept_len / (num_steps + 1)
    if not _ge(version, "0.5.11"):
        return accept_len / num_draft_tokens
    return (accept_len - 1) / (num_draft_tokens - 1)


def _unknown(unknown_field) -> tuple[str, str] | None:
    if unknown_field is None:
        return None
    if isinstance(unknown_field, str):
        name, _, value = unknown_field.partition(": ")
        return name, value
    return tuple(unknown_field)


# --- decode line (§3) ----------------------------------------------------------------------

def decode_line(
    version: str,
    *,
    ts: str = "2026-01-01 12:00:00",
    ms: int | None = None,
    rank: dict[str, int] | None = None,
    running: int = 32,
    queued: int = 0,
    tokens: int = 2268,
    usage: float = 0.02,
    accept_len: float | None = None,
    accept_rate: float | None | object = _DEFAULT,
    cap_len: float | None = None,
    graph=_DEFAULT,
    graph_on: bool = True,
    throughput: float = 400.57,
    iteration: int | None = None,
    hybrid: str | None = None,
    pd_decode: bool = False,
    mfu: bool = False,
    occupancy: bool = False,
    ray_prefix: str | bool | None = None,
    unknown_field: str | tuple[str, str] | None = None,
) -> tuple[str, dict]:
    """One `Decode batch` line of `version` and its expected `DecodeBatch` values.

    rank: token -> number, printed in the version's order (None = single-GPU default: `TP0` on
    0.4.6, nothing since 0.4.9). graph: label kind; default = `cuda` where printed (not 0.4.6).
    accept_rate: default = the version's formula from accept_len (§4), printed 0.5.3.post3+.
    hybrid: "swa" | "mamba" | "hisparse" KV blocks; swa/mamba print no plain `token usage`, so
    expected then omits token_usage/num_tokens. unknown_field: "name: value" inserted before the
    graph flag (a field a future SGLang adds). ray_prefix: True or "(Name pid=N[, ip=a.b.c.d])".
    Combinations a version never prints raise ValueError.
    """
    _check_version(version)
    head, exp = _prefix(version, ts, ms, rank, ray_prefix)
    start, it = _start(version, "Decode", iteration)
    fields: dict[str, str] = {}
    parts: list[str] = []
    _add(parts, fields, "#running-req", str(running))
    exp.update(running_requests=running, queued_requests=queued, forward_iteration=it)

    # KV usage block
    if hybrid is None or hybrid == "hisparse":
        _add(parts, fields, "#token", str(tokens))
        _add(parts, fields, "token usage", _f2(usage))
        exp.update(num_tokens=tokens, token_usage=float(_f2(usage)))
        if hybrid == "hisparse":
            if version != "0.5.23":
                raise ValueError("HiSparse usage fields: 0.5.23")
            _add(parts, fields, "#gpu token", str(tokens // 4))
            _add(parts, fields, "gpu token usage", _f2(usage / 2))
            _add(parts, fields, "#cpu token", str(tokens - tokens // 4))
            _add(parts, fields, "cpu token usage", _f2(usage / 3))
    elif hybrid == "swa":
        if version == "0.4.9":  # allocator.py@0.4.9 shape; values are not `name: value`
            parts.append(f"#token: full={tokens}, swa={tokens // 8}")
            parts.append(f"token usage: full={_f2(usage)}, swa={_f2(usage / 8)}")
        elif not _ge(version, "0.4.10"):
            raise ValueError("SWA usage block from 0.4.9 on")
        else:
            _add(parts, fields, "#full token", str(tokens))
            _add(parts, fields, "full token usage", _f2(usage))
            _add(parts, fields, "#swa token", str(tokens // 8))
            _add(parts, fields, "swa token usage", _f2(usage / 8))
    elif hybrid == "mamba":
        if not _ge(version, "0.5.3"):
            raise ValueError("mamba usage block: 0.5.3+ in this generator")
        _add(parts, fields, "#full token", str(tokens))
        _add(parts, fields, "full token usage", _f2(usage))
        _add(parts, fields, "mamba num", "12")
        _add(parts, fields, "mamba usage", _f2(usage * 2))
    else:
        raise ValueError(f"hybrid must be None, 'swa', 'mamba' or 'hisparse', not {hybrid!r}")

    # speculative fields
    if accept_len is None:
        if accept_rate not in (_DEFAULT, None) or cap_len is not None:
            raise ValueError("accept_rate/cap_len need accept_len")
        exp.update(accept_length=None, accept_rate=None)
    else:
        _add(parts, fields, "accept len", _f2(accept_len))
        exp["accept_length"] = float(_f2(accept_len))
        if accept_rate is _DEFAULT:
            accept_rate = default_accept_rate(version, accept_len)
        if accept_rate is not None:
            if not _ge(version, "0.5.3.post3"):
                raise ValueError("accept rate printed from 0.5.3.post3 on")
            _add(parts, fields, "accept rate", _f2(accept_rate))
            exp["accept_rate"] = float(_f2(accept_rate))
        else:
            exp["accept_rate"] = None
        if cap_len is not None:
            if not _ge(version, "0.5.18"):
                raise ValueError("cap len from 0.5.18 on")
            _add(parts, fields, "cap len", _f2(cap_len))

    # PD decode-node fields
    if pd_decode:
        _add(parts, fields, "pre-allocated usage", "0.05")
        if _ge(version, "0.5.3"):
            _add(parts, fields, "#prealloc-req", "2")
            _add(parts, fields, "#transfer-req", "1")
        if _ge(version, "0.4.9"):
            _add(parts, fields, "#retracted-req", "0")

    unk = _unknown(unknown_field)
    if unk:
        _add(parts, fields, *unk)

    _graph(version, graph, graph_on, parts, fields, exp)
    _add(parts, fields, "gen throughput (token/s)", _f2(throughput))
    _add(parts, fields, "#queue-req", str(queued))
    exp["gen_throughput"] = float(_f2(throughput))

    # end of line
    if version in ("0.4.6", "0.4.9"):
        if mfu or occupancy:
            raise ValueError(f"{version} has no suffixes")
        end = ""
    elif not _ge(version, "0.5.9"):
        if mfu or occupancy:
            raise ValueError(f"{version} has no suffixes")
        end = ", "
    else:
        suffix: list[str] = []
        if mfu:
            if not _ge(version, "0.5.10"):
                raise ValueError("MFU suffix from 0.5.10 on")
            _add(suffix, fields, "est. decode TFLOPS/s (per GPU)", "118.42")
            _add(suffix, fields, "est. read BW (GB/s per GPU)", "2931.07")
            _add(suffix, fields, "est. write BW (GB/s per GPU)", "14.66")
        if occupancy:
            if not _ge(version, "0.5.14"):
                raise ValueError("occupancy suffix from 0.5.14 on")
            if version == "0.5.23":
                # stand-in pair; 0.5.23 prints `fwd occupancy: x%, fwd+idle occupancy: y%` (§3)
                _add(suffix, fields, "device timer fwd (ms)", "21.37")
            else:
                _add(suffix, fields, "fwd occupancy", "93.40%")
        end = "".join(", " + s for s in suffix)
    exp["fields"] = fields
    return head + start + ", ".join(parts) + end, exp


# --- prefill line (§5) ---------------------------------------------------------------------

def prefill_line(
    version: str,
    *,
    ts: str = "2026-01-01 12:00:00",
    ms: int | None = None,
    rank: dict[str, int] | None = None,
    new_seq: int = 1,
    new_token: int = 158,
    cached_token: int = 0,
    tokens: int = 11179,
    usage: float = 0.08,
    running: int = 31,
    queued: int = 0,
    graph=_DEFAULT,
    graph_on: bool = True,
    input_throughput: float = 559.53,
    pending_token: int = 0,
    replay_token: int = 0,
    iteration: int | None = None,
    hybrid: str | None = None,
    pd_prefill: bool = False,
    mfu: bool = False,
    ray_prefix: str | bool | None = None,
    unknown_field: str | tuple[str, str] | None = None,
) -> tuple[str, dict]:
    """One `Prefill batch` line of `version` and its expected `PrefillBatch` values.

    graph and input throughput are printed from 0.5.9 on (graph last in 0.5.9, throughput last
    since 0.5.10); `#pending-token` since 0.5.11; `#replay-token` on 0.5.23 when non-zero.
    """
    _check_version(version)
    head, exp = _prefix(version, ts, ms, rank, ray_prefix)
    start, it = _start(version, "Prefill", iteration)
    fields: dict[str, str] = {}
    parts: list[str] = []
    _add(parts, fields, "#new-seq", str(new_seq))
    _add(parts, fields, "#new-token", str(new_token))
    _add(parts, fields, "#cached-token", str(cached_token))
    exp.update(new_seq=new_seq, new_token=new_token, cached_token=cached_token,
               running_requests=running, queued_requests=queued, forward_iteration=it)

    if hybrid is None:
        if version == "0.4.9":
            _add(parts, fields, "#token", str(tokens))
        _add(parts, fields, "token usage", _f2(usage))
        exp["token_usage"] = float(_f2(usage))
    elif not _ge(version, "0.4.10"):
        raise ValueError("hybrid prefill usage from 0.4.10 on")
    elif hybrid == "swa":
        _add(parts, fields, "full token usage", _f2(usage))
        _add(parts, fields, "swa token usage", _f2(usage / 8))
    elif hybrid == "mamba":
        _add(parts, fields, "full token usage", _f2(usage))
        _add(parts, fields, "mamba usage", _f2(usage * 2))
    else:
        raise ValueError(f"prefill hybrid must be None, 'swa' or 'mamba', not {hybrid!r}")

    _add(parts, fields, "#running-req", str(running))
    _add(parts, fields, "#queue-req", str(queued))
    if _ge(version, "0.5.11"):
        _add(parts, fields, "#pending-token", str(pending_token))
    elif pending_token:
        raise ValueError("#pending-token from 0.5.11 on")
    if replay_token:
        if version != "0.5.23":
            raise ValueError("#replay-token: 0.5.23")
        _add(parts, fields, "#replay-token", str(replay_token))

    if pd_prefill:
        if not _ge(version, "0.5.3"):
            names = ("#unbootstrapped-req", "#transferring-req")
        elif not _ge(version, "0.5.12"):
            names = ("#prealloc-req", "#inflight-req")
        else:
            names = ("#bootstrap-req", "#inflight-req")
        for n, name in enumerate(names):
            _add(parts, fields, name, str(n + 1))

    unk = _unknown(unknown_field)
    if unk:
        _add(parts, fields, *unk)

    if _ge(version, "0.5.9"):
        gparts: list[str] = []
        _graph(version, graph, graph_on, gparts, fields, exp)
        tput = f"input throughput (token/s): {_f2(input_throughput)}"
        fields["input throughput (token/s)"] = _f2(input_throughput)
        exp["input_throughput"] = float(_f2(input_throughput))
        # 0.5.9: throughput then graph flag; 0.5.10+: graph flag then throughput
        parts += ([tput] + gparts) if version == "0.5.9" else (gparts + [tput])
    else:
        if (graph is not _DEFAULT and graph is not None) or not graph_on:
            raise ValueError("prefill graph flag from 0.5.9 on")
        exp.update(graph_enabled=None, graph_kind=None, input_throughput=None)

    end = ", " if _ge(version, "0.4.10") and not _ge(version, "0.5.9") else ""
    if mfu:
        if not _ge(version, "0.5.10"):
            raise ValueError("MFU suffix from 0.5.10 on")
        fields["est. prefill TFLOPS/s (per GPU)"] = "402.18"
        end += ", est. prefill TFLOPS/s (per GPU): 402.18"
    exp["fields"] = fields
    return head + start + ", ".join(parts) + end, exp


# --- server_args line ------------------------------------------------------------------------

SPEC_ARG_KEYS = (
    "model_path", "speculative_algorithm", "speculative_draft_model_path",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "decode_log_interval",
)


def _server_args_defaults() -> dict[str, object]:
    # Field names and value shapes as SGLang's dataclass repr prints them (0.5.x launch log).
    return {
        "model_path": "moonshotai/Kimi-K2.5",
        "tokenizer_path": "moonshotai/Kimi-K2.5",
        "tokenizer_mode": "auto",
        "skip_tokenizer_init": False,
        "load_format": "auto",
        "model_loader_extra_config": "{}",
        "trust_remote_code": True,
        "context_length": None,
        "is_embedding": False,
        "revision": None,
        "host": "0.0.0.0",
        "port": 30000,
        "dtype": "auto",
        "quantization": None,
        "kv_cache_dtype": "auto",
        "mem_fraction_static": 0.85,
        "max_running_requests": 64,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "schedule_policy": "fcfs",
        "schedule_conservativeness": 1.0,
        "page_size": 1,
        "device": "cuda",
        "tp_size": 8,
        "pp_size": 1,
        "random_seed": 463521898,
        "log_level": "info",
        "log_level_http": None,
        "log_requests": False,
        "log_requests_level": 2,
        "uvicorn_access_log_exclude_prefixes": [],
        "enable_metrics": True,
        "decode_log_interval": 40,
        "served_model_name": "moonshotai/Kimi-K2.5",
        "chat_template": None,
        "reasoning_parser": "kimi_k2",
        "tool_call_parser": "kimi_k2",
        "dp_size": 1,
        "load_balance_method": "round_robin",
        "dist_init_addr": None,
        "nnodes": 1,
        "node_rank": 0,
        "json_model_override_args": '{"rope_scaling": {"type": "yarn", "factor": 4.0}}',
        "attention_backend": "flashinfer",
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/models/kimi-k25-eagle3-1.2b",
        "speculative_draft_model_revision": None,
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "speculative_accept_threshold_single": 1.0,
        "speculative_accept_threshold_acc": 1.0,
        "speculative_token_map": None,
        "ep_size": 1,
        "enable_dp_attention": False,
        "cuda_graph_max_bs": 64,
        "cuda_graph_bs": [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64],
        "disable_cuda_graph": False,
        "disaggregation_mode": "null",
        "mm_process_config": {},
        "forward_hooks": None,
    }


def server_args_line(*, ts: str = "2026-01-01 12:00:00", ms: int | None = None,
                     **overrides) -> tuple[str, dict]:
    """The startup `[ts] server_args=ServerArgs(...)` line (HTTP process: no rank tokens).

    Expected: the SPEC_ARG_KEYS plus every override, as Python values, and `timestamp`
    (naive datetime). Every other key is a `ServerArgs.args` entry.
    """
    args = _server_args_defaults()
    args.update(overrides)
    body = ", ".join(f"{k}={v!r}" for k, v in args.items())
    dt = datetime.strptime(ts, "%Y-%m-%d %H:%M:%S")
    stamp = ts
    if ms is not None:
        stamp = f"{ts}.{ms:03d}"
        dt = dt.replace(microsecond=ms * 1000)
    exp = {k: args[k] for k in SPEC_ARG_KEYS}
    exp.update(overrides)
    exp["timestamp"] = dt
    return f"[{stamp}] server_args=ServerArgs({body})", exp


# --- non-batch lines (§6) -----------------------------------------------------------------

_DECODE_TEXT = ("[2026-01-01 12:00:00 TP0] Decode batch, #running-req: 9, #token: 1200, "
                "token usage: 0.01, accept len: 1.00, accept rate: 0.00, cuda graph: True, "
                "gen throughput (token/s): 80.00, #queue-req: 0")


def request_log_lines() -> list[str]:
    """Request logs whose user text contains a whole decode line: they must stay OtherLine."""
    rid = "6f1c2a9e0b3d4c5f8a7e9d0c1b2a3f4e"
    sp = "{'max_new_tokens': 512, 'temperature': 0.0}"
    return [
        f"[2026-01-01 12:00:00] Receive: obj=GenerateReqInput(text='{_DECODE_TEXT} why is "
        f"my accept len stuck at 1.00?', input_ids=None, input_embeds=None, image_data=None, "
        f"sampling_params={sp}, rid='{rid}', return_logprob=False, logprob_start_len=-1, "
        f"top_logprobs_num=0, stream=True, log_metrics=True, lora_path=None, "
        f"custom_logit_processor=None)",
        f"[2026-01-01 12:00:03] Finish: obj=GenerateReqInput(text='Summarise: {_DECODE_TEXT}', "
        f"sampling_params={sp}, rid='{rid}', stream=False), out={{'text': 'The line says "
        f"{_DECODE_TEXT}', 'meta_info': {{'id': '{rid}', 'finish_reason': {{'type': 'stop', "
        f"'matched': 151643}}, 'prompt_tokens': 93, 'completion_tokens': 61, "
        f"'spec_verify_ct': 61, 'spec_accept_length': 1.0, 'cached_tokens': 0}}}}",
        "[2026-01-01 12:00:00] " + json.dumps({
            "timestamp": "2026-01-01T12:00:00.412345", "event": "request.received",
            "rid": rid, "obj": {"text": _DECODE_TEXT, "sampling_params": {"max_new_tokens": 512}},
        }),
        json.dumps({  # --log-requests-target file: JSON without the bracket prefix
            "timestamp": "2026-01-01T12:00:03.001122", "event": "request.finished", "rid": rid,
            "out": {"text": _DECODE_TEXT, "meta_info": {"completion_tokens": 61}},
        }),
        # continuation line of a multi-line prompt: decode text without the bracket prefix
        _DECODE_TEXT.split("] ", 1)[1],
    ]


def other_lines() -> list[str]:
    """Realistic lines that are not batch lines (§6): all must parse as OtherLine."""
    cr = "\r"
    return request_log_lines() + [
        '[2026-01-01 12:00:00] INFO:     127.0.0.1:40052 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
        '[2026-01-01 12:00:00] INFO:     10.0.0.7:51234 - "GET /metrics HTTP/1.1" 200 OK',
        '[2026-01-01 12:00:00] INFO:     10.0.0.7:51240 - "GET /health_generate HTTP/1.1" 503 Service Unavailable',
        "[2026-01-01 12:00:00 DP2 TP2 EP2] Scheduler hit an exception: Traceback (most recent call last):",
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2790, in run_scheduler_process',
        "    scheduler.event_loop_overlap()",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB",
        "Capturing batches (bs=4 avail_mem=20.31 GB):  88%|████████▊ | 23/26 [00:03<00:00,  7.66it/s]"
        + cr + "Capturing batches (bs=2 avail_mem=20.30 GB):  92%|█████████▏| 24/26 [00:03<00:00,  7.70it/s]"
        + cr + "Capturing batches (bs=1 avail_mem=20.30 GB): 100%|██████████| 26/26 [00:03<00:00,  7.12it/s]",
        "Loading safetensors checkpoint shards:  50% Completed | 32/64 [00:30<00:30,  1.05it/s]" + cr,
        "[2026-01-01 12:00:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=21.50 GB",
        "[2026-01-01 12:00:00 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=20.45 GB, mem usage=58.30 GB.",
        "[2026-01-01 12:00:00 TP0] KV Cache is allocated. #tokens: 1000000, K size: 30.00 GB, V size: 30.00 GB",
        "[2026-01-01 12:00:00 TP0] Decode out of memory happened. #retracted_reqs: 1, #new_token_ratio: 0.7000 -> 1.0000",
        "[2026-01-01 12:00:00] WARNING: The endpoint /get_server_info is deprecated; use /server_info instead.",
        "[2026-01-01 12:00:00] The server is fired up and ready to roll!",
        "[2026-01-01 12:00:00] Receive: obj=GenerateReqInput(text='paste: [2026-01-01 12:00:00] "
        "server_args=ServerArgs(model_path=\\'x\\', speculative_algorithm=None, "
        "decode_log_interval=1)', rid='0a1b2c3d', stream=False)",
        "[aiter] import [module_aiter_enum] under /sgl-workspace/aiter/aiter/jit/module_aiter_enum.so",
        "(SGLangEngine pid=35555) [2026-01-01 12:00:00 TP0] Load weight begin. avail mem=78.50 GB",
        "(APIServer pid=1) INFO 05-06 06:11:23 [loggers.py:271] Engine 000: Avg prompt throughput: 1436.3 tokens/s, Running: 3 reqs",
        "",
        "   ",
    ]


def malformed_lines() -> list[str]:
    """Lines that start like batch lines but were cut short or garbled: all MalformedLine."""
    d23, _ = decode_line("0.5.23", rank={"TP": 0}, accept_len=1.05, accept_rate=0.21)
    d4, _ = decode_line("0.4.9", rank={"DP": 0, "TP": 0}, accept_len=2.90)
    d10, _ = decode_line("0.5.6")
    p10, _ = prefill_line("0.5.10")
    cut = lambda line, after: line[: line.index(after) + len(after)]  # noqa: E731
    return [
        # like BR-01: cut after "token usage:"
        cut(d23, "token usage:"),
        cut(d4, "token usage:"),
        cut(decode_line("0.5.9")[0], "token usage:"),
        # no #queue-req (cut at a field boundary)
        d23[: d23.index(", #queue-req")],
        d10[: d10.index(", #queue-req")],
        # no #running-req
        d23.replace("#running-req: 32, ", ""),
        # last field without a value
        cut(d23, "#queue-req:"),
        cut(d23, "gen throughput (token/s): "),
        cut(d4, "gen throughput (tok"),  # column-truncated terminal copy
        cut(d23, "#running-req: 32, #tok"),
        # garbled numbers / empty values
        d23.replace("accept len: 1.05", "accept len: 1.0x5"),
        d23.replace("#running-req: 32", "#running-req: 3a2"),
        d23.replace("accept len: 1.05", "accept len: "),
        d4.replace("#queue-req: 0", "#queue-req: "),
        # impossible timestamps (garbled bytes)
        d23.replace("2026-01-01 12:00:00", "2026-02-30 12:00:00"),
        p10.replace("2026-01-01 12:00:00", "2026-01-01 25:61:00"),
        # head only
        "[2026-01-01 12:00:00 TP0] Decode batch.",
        "[2026-01-01 12:00:00] Decode batch, ",
        # prefill cut short
        cut(p10, "#queue-"),
        p10[: p10.index(", #queue-req")],
        cut(p10, "#new-token:"),
    ]


def with_container_prefix(line: str, prefix: str = "sglang-1  | ") -> str:
    """The line as a compose-style log collector shows it."""
    return prefix + line


# --- mixed log for benchmarks ----------------------------------------------------------------

def mixed_log(version: str, lines: int, ranks: int = 1, collapse_after: int | None = None,
              seed: int = 0, spec: bool = True, container_prefix: str | None = None,
              start: str = "2026-01-01 12:00:00"):
    """Yield `lines` lines of a realistic server log: startup, then prefill/decode/access/request.

    ranks > 1: DP attention, one decode line per DP rank per interval (`DPn TPn`).
    collapse_after: from that output line on, accept len falls to ~1.0 (draft never accepted).
    """
    _check_version(version)
    rnd = random.Random(seed)
    now = datetime.strptime(start, "%Y-%m-%d %H:%M:%S")
    out = 0

    def emit(text: str):
        return with_container_prefix(text, container_prefix) if container_prefix else text

    def ts() -> str:
        return now.strftime("%Y-%m-%d %H:%M:%S")

    def rank_of(i: int) -> dict[str, int] | None:
        if ranks > 1:
            return {"DP": i, "TP": i}
        return None

    no_spec = dict.fromkeys(("speculative_algorithm", "speculative_draft_model_path",
                             "speculative_num_steps", "speculative_eagle_topk",
                             "speculative_num_draft_tokens"))
    startup = [server_args_line(ts=ts(), **({} if spec else no_spec))[0]]
    for i in range(max(ranks, 1)):
        rk = _rank_text(version, rank_of(i))[0]
        b = f"[{ts()}{' ' + rk if rk else ''}] "
        startup += [b + "Load weight begin. avail mem=78.50 GB",
                    b + "Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
                        "avail mem=20.45 GB, mem usage=58.05 GB.",
                    b + "KV Cache is allocated. #tokens: 1000000, K size: 30.00 GB, V size: 30.00 GB"]
    startup.append(f"[{ts()}] The server is fired up and ready to roll!")
    for s in startup:
        if out >= lines:
            return
        yield emit(s)
        out += 1

    max_total_tokens = 1_000_000
    while out < lines:
        now += timedelta(seconds=rnd.choice((1, 2, 3, 4)))
        kind = rnd.random()
        if kind < 0.10:
            text = prefill_line(version, ts=ts(), rank=rank_of(rnd.randrange(max(ranks, 1))),
                                new_token=rnd.randint(20, 4000), running=rnd.randint(0, 64),
                                queued=rnd.randint(0, 4), usage=rnd.random() * 0.3)[0]
            batch = [text]
        elif kind < 0.18:
            batch = [f'[{ts()}] INFO:     10.0.0.{rnd.randint(2, 250)}:{rnd.randint(30000, 60000)} '
                     f'- "POST /v1/chat/completions HTTP/1.1" 200 OK']
        elif kind < 0.20:
            batch = [rnd.choice(request_log_lines())]
        else:
            collapsed = collapse_after is not None and out >= collapse_after
            batch = []
            for i in range(max(ranks, 1)):
                running = rnd.randint(1, 64)
                tokens = running * rnd.randint(200, 4000)  # KV tokens held by the batch
                acc = None
                if spec:
                    acc = 1.0 + rnd.random() * 0.06 if collapsed else 2.4 + rnd.random() * 0.8
                thr = (120 if collapsed else 330) * (0.8 + rnd.random() * 0.4)
                batch.append(decode_line(
                    version, ts=ts(), rank=rank_of(i), running=running,
                    queued=rnd.randint(0, 3), tokens=tokens, usage=tokens / max_total_tokens,
                    accept_len=acc, throughput=thr)[0])
        for text in batch:
            if out >= lines:
                return
            yield emit(text)
            out += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="0.5.23", choices=VERSIONS)
    ap.add_argument("--lines", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=1, help="DP ranks (one decode line each)")
    ap.add_argument("--collapse-after", type=int, default=None,
                    help="output line from which accept len falls to ~1.0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-spec", action="store_true", help="no speculative decoding fields")
    ap.add_argument("--container-prefix", default=None, help='e.g. "sglang-1  | "')
    a = ap.parse_args(argv)
    w = sys.stdout.write
    try:
        for text in mixed_log(a.version, a.lines, a.ranks, a.collapse_after, a.seed,
                              not a.no_spec, a.container_prefix):
            w(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: silence the flush at exit (Python docs recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())


def collapse_log(path, ranks: int, collapses: dict[int, tuple[int, int]], restart_at: int | None = None) -> None:
    """Two minutes of an SGLang 0.5.23 server with `ranks` DP ranks, one decode line per rank a
    second from 10:00:00: DP r's draft collapses (accept len 1.02) for the seconds
    collapses[r] = (first, end); a `server_args` line (a restart) follows second `restart_at`."""
    draft = {"speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "/models/llama-3.1-8b-eagle3"}
    lines = [server_args_line(ts="2026-03-01 09:59:00", **draft)[0]]
    for i in range(120):
        ts = f"2026-03-01 10:{i // 60:02d}:{i % 60:02d}"
        for r in range(ranks):
            first, stop = collapses.get(r, (0, 0))
            collapsed = first <= i < stop
            a = 1.02 if collapsed else 2.6 + 0.3 * math.sin(i / 7 + r)
            tp = 560.0 if collapsed else 900.0 + 50 * r + 20 * math.sin(i / 5)
            lines.append(decode_line("0.5.23", ts=ts, rank={"DP": r, "TP": r}, accept_len=a, throughput=tp)[0])
        if i == restart_at:
            lines.append(server_args_line(ts=ts, **draft)[0])
    path.write_text("\n".join(lines) + "\n")


def three_rank_collapse_log(path) -> None:
    """3 DP ranks: DP1's draft collapses from 10:00:40 to 10:01:19 (40 lines at accept len 1.02),
    and the server restarts (a `server_args` line) at 10:01:40. For `replay --plot` (tests,
    docs/make_pictures.py)."""
    collapse_log(path, 3, {1: (40, 80)}, restart_at=100)


def eight_rank_two_collapses_log(path) -> None:
    """8 DP ranks: DP3 collapses from 10:00:40 to 10:01:19 and DP5 from 10:00:45 to 10:01:24, so
    their episodes overlap. For `replay --plot` and the rank-disagreement wording."""
    collapse_log(path, 8, {3: (40, 80), 5: (45, 85)})
