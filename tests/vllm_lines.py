"""Generator of vLLM log lines with known values, one variant per format vLLM printed (0.5 to 0.33).

Formats follow the printing code named in specwatch/engines/vllm/log.py and docs/vllm.md; each
builder returns the line text. `VERSIONS` are the format changes:

    V0 0.5.0 ("tokens tokens"), 0.6.6 (V0), V1 0.8.3 (no mean acceptance length), 0.8.5 (mean
    acceptance length without the bonus token), 0.9.0, 0.10.1 (APIServer tag), 0.10.2 (throughputs),
    0.17.1, 0.30.0 (`%s KV cache usage`), 0.33.0 (tag in the formatter).
"""

from __future__ import annotations

VERSIONS = ("0.5.0", "0.6.6", "0.8.3", "0.8.5", "0.9.0", "0.10.1", "0.10.2", "0.17.1", "0.30.0", "0.33.0")


def vkey(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def is_v0(version: str) -> bool:
    return vkey(version) < (0, 8)


def prefix(version: str, ts: str = "03-01 10:00:00", file: str = "metrics.py", line: int = 101,
           tag: str | None = "APIServer", level: str = "INFO") -> str:
    """The header of a line: `ts` is `MM-DD HH:MM:SS`; the process tag only where the version
    prints one for the API server (0.10.1+; engine-core tags from 0.8.3)."""
    if vkey(version) < (0, 8):
        return f"{level} {ts} {file}:{line}] "
    head = f"{level} {ts} [{file}:{line}] "
    if tag and (vkey(version) >= (0, 10, 1) or tag != "APIServer") and vkey(version) >= (0, 8, 3):
        return f"({tag} pid=7) " + head
    return head


def spec_line(version: str, *, accepted: int, drafted: int, positions: list[float], ts: str = "03-01 10:00:10",
              seconds: float = 10.0, tight: bool = False) -> str:
    """The V1 `SpecDecoding metrics` line of one interval (k = len(positions) drafts of
    drafted / k each). tight: the irregular spacing of some builds (`394.48tokens/s`, `0.000,0.000`)."""
    k = len(positions)
    drafts = drafted // k
    rate = 100.0 * accepted / drafted
    pos = ", ".join(f"{p:.3f}" for p in positions)
    if tight and k > 2:
        pos = ", ".join(f"{p:.3f}" for p in positions[:-1]) + f",{positions[-1]:.3f}"
    v = vkey(version)
    if v < (0, 8, 5):
        body = f"Draft acceptance rate: {rate:.1f}%, Accepted: {accepted} tokens, Drafted: {drafted} tokens"
    elif v < (0, 10, 2):
        mal = accepted / drafts + (0 if v < (0, 9) else 1)
        body = (f"Draft acceptance rate: {rate:.1f}%, Mean acceptance length: {mal:.2f}, Accepted: {accepted} tokens, "
                f"Drafted: {drafted} tokens, Per-position acceptance rate: {pos}")
    else:
        unit = "tokens/s" if tight else " tokens/s"
        body = (f"Mean acceptance length: {1 + accepted / drafts:.2f}, Accepted throughput: {accepted / seconds:.2f} tokens/s, "
                f"Drafted throughput: {drafted / seconds:.2f}{unit}, Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
                f"Per-position acceptance rate: {pos}, Avg Draft acceptance rate: {rate:.1f}%")
    return prefix(version, ts) + "SpecDecoding metrics: " + body


def v0_spec_line(version: str, *, k: int, accepted: int, draft: int, emitted: int, ts: str = "03-01 10:00:05") -> str:
    """The V0 `Speculative metrics` line: counters since the engine started."""
    tt = " tokens" if vkey(version) < (0, 5, 3) else ""
    rate = accepted / draft if draft else float("nan")
    eff = emitted / ((draft / k) * (k + 1)) if draft else float("nan")
    return (prefix(version, ts, line=316) + f"Speculative metrics: Draft acceptance rate: {rate:.3f}, System efficiency: "
            f"{eff:.3f}, Number of speculative tokens: {k}, Number of accepted tokens: {accepted}, Number of draft "
            f"tokens{tt}: {draft}, Number of emitted tokens{tt}: {emitted}.")


def stats_line(version: str, *, running: int, waiting: int, gen: float, kv: float, engine: int | None = 0,
               ts: str = "03-01 10:00:10", aggregated: int | None = None, preemptions: int = 0) -> str:
    """The periodic stats line (kv in percent)."""
    v = vkey(version)
    if is_v0(version):
        return (prefix(version, ts, line=295) + f"Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: "
                f"{gen:.1f} tokens/s, Running: {running} reqs, Swapped: 0 reqs, Pending: {waiting} reqs, GPU KV cache "
                f"usage: {kv:.1f}%, CPU KV cache usage: 0.0%.")
    head = f"{aggregated} Engines Aggregated: " if aggregated else (f"Engine {engine:03d}: " if engine is not None else "")
    parts = ["Avg prompt throughput: 100.0 tokens/s", f"Avg generation throughput: {gen:.1f} tokens/s",
             f"Running: {running} reqs", f"Waiting: {waiting} reqs"]
    if v >= (0, 12) and preemptions:
        parts.append(f"Preemptions: {preemptions}")
    parts.append(f"{'GPU' if v < (0, 30) else 'XPU'} KV cache usage: {kv:.1f}%")
    parts.append("Prefix cache hit rate: 12.5%")
    return prefix(version, ts, file="loggers.py", line=271) + head + ", ".join(parts)


def config_line(version: str, *, method: str | None = "eagle3", draft: str | None = "/models/draft",
                k: int = 3, model: str = "/models/target", tp: int = 1, dp: int = 1, ts: str = "03-01 09:59:00") -> str:
    """The engine-config line of the engine-core process (V1) or the engine (V0)."""
    v = vkey(version)
    if method is None and draft is None:
        spec = "None"
    elif v < (0, 8):
        spec = f"SpeculativeConfig(draft_model={draft!r}, num_spec_tokens={k})"
    else:
        spec = f"SpeculativeConfig(method={method!r}, model={draft!r}, num_spec_tokens={k})"
    rest = (f"model={model!r}, speculative_config={spec}, tokenizer={model!r}, skip_tokenizer_init=False, "
            f"tensor_parallel_size={tp}, pipeline_parallel_size=1, data_parallel_size={dp}, seed=0")
    if is_v0(version):
        return prefix(version, ts, file="llm_engine.py", line=249) + f"Initializing an LLM engine (v{version}) with config: {rest}"
    return (prefix(version, ts, file="core.py", line=140, tag="EngineCore_DP0")
            + f"Initializing a V1 LLM engine (v{version}) with config: {rest}")
