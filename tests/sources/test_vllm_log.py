"""The vLLM log grammar (specwatch/engines/vllm/log.py): every vLLM line of the bug-report
samples with its values, every generated format, V0 counter deltas across restarts, and lines
that only look like stats (request logs, access logs)."""

from datetime import datetime, timezone
from pathlib import Path

import pytest

import vllm_lines as g
from specwatch.core.events import DecodeBatch, MalformedLine, OtherLine, ServerArgs
from specwatch.engines import parse_line as any_engine
from specwatch.engines.vllm.log import (
    VllmAssembler,
    VllmConfig,
    VllmSpecDecoding,
    VllmStats,
    VllmV0Spec,
    algorithm,
    maybe_event,
    parse_line,
)

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples" / "bugreport-logs"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc).timestamp()


def lines_of(name: str) -> list[str]:
    return [ln for ln in (SAMPLES / name).read_text().splitlines() if ln and not ln.startswith("#")]


def ts(stamp: str, year: int = 2026) -> float:
    """`MM-DD HH:MM:SS` of a line (this host's zone, as parse_line reads it by default)."""
    return datetime.strptime(f"{year}-{stamp}", "%Y-%m-%d %H:%M:%S").timestamp()


def parse(line: str):
    return parse_line(line, now=NOW)


def assemble(lines: list[str]) -> list[object]:
    a, out = VllmAssembler(), []
    for line in lines:
        out += a.take(parse(line))
    return out


# --- every vLLM line of the samples, values written out ---


def test_br06_dflash_lines_irregular_spacing_and_a_cut_line():
    a, b, cut = lines_of("BR-06.log")
    e = parse(a)
    assert type(e) is VllmSpecDecoding
    assert (e.timestamp, e.accept_length, e.accepted, e.drafted, e.accept_rate) == (ts("06-30 18:16:28"), 1.34, 49, 2160, 0.023)
    assert e.positions == (0.340,) + (0.0,) * 14
    assert e.fields["Accepted throughput"] == "0.69 tokens/s" and e.fields["Drafted throughput"] == "30.29 tokens/s"
    e = parse(b)  # "394.48tokens/s" and "0.000,0.000"
    assert (e.accept_length, e.accepted, e.drafted, e.accept_rate) == (1.22, 57, 3945, 0.014)
    assert e.fields["Drafted throughput"] == "394.48tokens/s"
    assert e.positions == (0.217,) + (0.0,) * 14 and len(e.positions) == 15
    e = parse(cut)  # ends "Avg Draft acceptance rat"
    assert type(e) is MalformedLine and e.timestamp == ts("06-30 18:16:48") and "cut short" in e.reason


def test_br07_mtp_config_stats_and_spec_lines():
    cfg, stats1, spec1, access, stats2, spec2 = lines_of("BR-07.log")
    e = parse(cfg)
    assert type(e) is VllmConfig and e.timestamp == ts("05-06 06:05:38")
    assert e.args == {"engine": "vllm", "vllm_version": "0.20.2rc1.dev49+g9b4e83934", "model_path": "/model",
                      "tp_size": 1, "pp_size": 1, "dp_size": 1, "speculative_algorithm": "MTP",
                      "speculative_method": "mtp", "speculative_draft_model_path": "google/gemma-4-31B-it-assistant",
                      "num_speculative_tokens": 4, "speculative_num_steps": 4, "speculative_eagle_topk": 1}
    s = parse(stats1)
    assert type(s) is VllmStats
    assert (s.timestamp, s.engine, s.running, s.waiting, s.gen_throughput, s.kv_usage) == (
        ts("05-06 06:11:23"), 0, 3, 0, 93.9, pytest.approx(0.361))
    assert s.fields["Prefix cache hit rate"] == "27.4%"
    assert type(parse(access)) is OtherLine
    out = assemble([cfg, stats1, spec1, access, stats2, spec2])
    assert type(out[0]) is ServerArgs and out[0].args["speculative_algorithm"] == "MTP"
    d1, d2 = out[1:]
    assert (d1.rank, d1.ranks, d1.running_requests, d1.queued_requests, d1.gen_throughput, d1.accept_length) == (
        "", {}, 3, 0, 93.9, 1.03)  # one engine (data_parallel_size=1): no rank, as a single GPU
    assert (d1.accepted_tokens, d1.draft_tokens, d1.position_accept_rates, d1.accept_rate) == (
        25, 3652, (0.027, 0.0, 0.0, 0.0), pytest.approx(0.007))
    assert (d2.timestamp, d2.gen_throughput, d2.token_usage, d2.accept_length, d2.accepted_tokens, d2.draft_tokens) == (
        ts("05-06 06:11:33"), 44.7, pytest.approx(0.415), 1.03, 15, 1724)
    assert d1.engine == d2.engine == "vllm"


def test_br10_ascend_zero_acceptance_and_cut_lines():
    l1, l2, l3, cut1, cut2 = lines_of("BR-10.log")
    out = assemble([l1, l2, l3])
    assert [(d.timestamp, d.accept_length, d.accepted_tokens, d.draft_tokens, d.accept_rate) for d in out] == [
        (ts("08-05 20:20:43"), 1.0, 0, 495, 0.0), (ts("08-05 20:35:43"), 1.0, 0, 495, 0.0),
        (ts("08-05 20:38:23"), 1.0, 0, 495, 0.0)]
    # no stats line before them (the reporter grepped): drafts prove a running request
    assert {(d.rank, d.running_requests, d.position_accept_rates) for d in out} == {("", 1, (0.0,) * 5)}
    assert out[0].fields["Drafted throughput"] == "1.23 tokens/s"
    for line in (cut1, cut2):  # "…Drafted: 15 tokens, Per-pos" and "…Drafted throughput: 8.80 toke"
        e = parse(line)
        assert type(e) is MalformedLine and "cut short" in e.reason


def test_br15_v0_cumulative_counters():
    a, b = lines_of("BR-15.log")
    e = parse(a)
    assert type(e) is VllmV0Spec
    assert (e.timestamp, e.k, e.accepted, e.draft, e.emitted, e.accept_rate, e.efficiency) == (
        ts("02-06 03:05:53"), 5, 1, 5, 1, 0.2, 0.167)
    d1, d2 = assemble([a, b])
    # first line: since the engine started (5 draft tokens = 1 step, 1 token emitted)
    assert (d1.accept_length, d1.accept_rate, d1.accepted_tokens, d1.draft_tokens) == (1.0, 0.2, 1, 5)
    # second: the change, 10 draft tokens (2 steps of 5), 2 emitted, 0 accepted
    assert (d2.accept_length, d2.accept_rate, d2.accepted_tokens, d2.draft_tokens) == (1.0, 0.0, 0, 10)
    assert d2.fields["interval emitted"] == "2" and d2.fields["Number of emitted tokens"] == "3"


def test_br16_per_position_rates():
    (line,) = lines_of("BR-16.log")
    (d,) = assemble([line])
    assert (d.timestamp, d.accept_length, d.accepted_tokens, d.draft_tokens, d.accept_rate) == (
        ts("05-01 14:24:50"), 2.37, 89, 975, pytest.approx(0.091))
    assert d.position_accept_rates == (0.600, 0.385, 0.215, 0.108, 0.062) + (0.0,) * 10


def test_br20_v0_medusa_tokens_tokens():
    lines = lines_of("BR-20.log")
    stats = parse(lines[0])
    assert type(stats) is VllmStats and stats.engine is None
    assert (stats.running, stats.waiting, stats.gen_throughput, stats.kv_usage) == (2, 0, 127.4, pytest.approx(0.008))
    e = parse(lines[1])
    assert (e.k, e.accepted, e.draft, e.emitted, e.accept_rate, e.efficiency) == (16, 0, 42272, 2642, 0.0, 0.059)
    d1, d2 = assemble(lines)
    assert (d1.rank, d1.running_requests, d1.gen_throughput, d1.accept_length, d1.draft_tokens) == ("", 2, 127.4, 1.0, 42272)
    # 51056 - 42272 = 8784 draft tokens = 549 steps of 16, 3191 - 2642 = 549 emitted: 1.00 per step
    assert (d2.running_requests, d2.gen_throughput, d2.accept_length, d2.draft_tokens, d2.accepted_tokens) == (
        2, 110.4, 1.0, 8784, 0)


@pytest.mark.parametrize("name", ["BR-04.log", "BR-05.log", "BR-14.log"])
def test_other_vllm_report_lines_are_not_stats(name):
    """Tracebacks, the embed_tokens verdicts, an offline script's printout: no stats here."""
    assert {type(parse(line)) for line in lines_of(name)} == {OtherLine}


# --- every generated format ---


@pytest.mark.parametrize("version", [v for v in g.VERSIONS if not g.is_v0(v)])
@pytest.mark.parametrize("tight", [False, True])
def test_v1_formats(version, tight):
    positions = [0.8, 0.5, 0.25, 0.05]
    drafts = 200
    accepted = round(sum(positions) * drafts)  # 320
    cfg = g.config_line(version, k=4)
    stats = g.stats_line(version, running=7, waiting=2, gen=321.5, kv=40.0, engine=1)
    spec = g.spec_line(version, accepted=accepted, drafted=drafts * 4, positions=positions, tight=tight)
    server_args, d = assemble([cfg, stats, spec])
    assert server_args.args["num_speculative_tokens"] == 4 and server_args.args["speculative_algorithm"] == "EAGLE3"
    assert (d.rank, d.running_requests, d.queued_requests, d.gen_throughput, d.token_usage) == ("DP1", 7, 2, 321.5, 0.4)
    # 1 + 320 / 200 drafts = 2.60 in every version (0.8.5 prints 1.60; 0.8.3 prints no length: k from the config)
    assert d.accept_length == pytest.approx(2.6)
    assert d.accept_rate == pytest.approx(0.4)
    assert (d.accepted_tokens, d.draft_tokens) == (320, 800)
    assert d.position_accept_rates == (None if g.vkey(version) < (0, 8, 5) else tuple(positions))


@pytest.mark.parametrize("version", [v for v in g.VERSIONS if g.is_v0(v)])
def test_v0_formats(version):
    cfg = g.config_line(version, draft="/models/small", k=4)
    lines = [cfg]
    for i, (acc, draft, emitted) in enumerate([(40, 100, 75), (100, 300, 200), (160, 500, 300)]):
        lines.append(g.stats_line(version, running=5, waiting=0, gen=50.0 + i, kv=3.0, ts=f"03-01 10:00:{5 * i:02d}"))
        lines.append(g.v0_spec_line(version, k=4, accepted=acc, draft=draft, emitted=emitted, ts=f"03-01 10:00:{5 * i:02d}"))
    out = assemble(lines)
    assert out[0].args["speculative_algorithm"] == "DRAFT_MODEL" and out[0].args["speculative_draft_model_path"] == "/models/small"
    assert [(d.accept_length, d.accept_rate, d.gen_throughput, d.running_requests) for d in out[1:]] == [
        (3.0, 0.4, 50.0, 5), (2.5, 0.3, 51.0, 5), (2.0, 0.3, 52.0, 5)]  # 4 * Δemitted / Δdraft


def test_v0_counters_start_again_after_a_restart():
    v = "0.6.6"
    lines = [g.v0_spec_line(v, k=2, accepted=50, draft=100, emitted=120),
             g.v0_spec_line(v, k=2, accepted=90, draft=200, emitted=230),
             g.v0_spec_line(v, k=2, accepted=5, draft=20, emitted=12),  # lower: the engine restarted
             g.v0_spec_line(v, k=2, accepted=15, draft=40, emitted=30)]
    out = assemble(lines)
    assert [(d.accept_length, d.accepted_tokens, d.draft_tokens) for d in out] == [
        (2.4, 50, 100), (2.2, 40, 100), (1.2, 5, 20), (1.8, 10, 20)]
    # an engine-config line also starts the counters again, even when they happen to be higher
    a = VllmAssembler()
    a.take(parse(lines[0]))
    a.take(parse(g.config_line(v, k=2)))
    (d,) = a.take(parse(lines[1]))
    assert (d.accepted_tokens, d.draft_tokens) == (90, 200)


def test_aggregated_and_dp_engines():
    v = "0.17.1"
    lines = [g.config_line(v, dp=2),
             g.stats_line(v, running=3, waiting=0, gen=10.0, kv=1.0, engine=0),
             g.spec_line(v, accepted=10, drafted=30, positions=[0.5, 0.3, 0.2]),
             g.stats_line(v, running=4, waiting=1, gen=20.0, kv=2.0, engine=1),
             g.spec_line(v, accepted=20, drafted=30, positions=[0.9, 0.6, 0.5]),
             g.stats_line(v, running=7, waiting=1, gen=30.0, kv=3.0, aggregated=2, ts="03-01 10:00:20"),
             g.spec_line(v, accepted=30, drafted=60, positions=[0.7, 0.5, 0.3], ts="03-01 10:00:20")]
    out = assemble(lines)[1:]
    assert [(d.rank, d.running_requests, d.accept_length) for d in out] == [
        ("DP0", 3, 2.0), ("DP1", 4, 3.0), ("", 7, 2.5)]
    # without the engine-config line, engine 0 is a rank once another engine shows up
    assert [d.rank for d in assemble(lines[1:] + lines[1:3])] == ["", "DP1", "", "DP0"]


def test_stats_without_a_spec_line_is_a_batch_without_acceptance():
    """Speculation off, or no drafts that interval: the stats line is a decode batch of its own
    once the engine's next stats line shows no spec line followed it."""
    v = "0.10.2"
    out = assemble([g.stats_line(v, running=2, waiting=0, gen=5.0, kv=1.0, ts="03-01 10:00:00"),
                    g.stats_line(v, running=3, waiting=0, gen=6.0, kv=1.0, ts="03-01 10:00:10")])
    assert [(d.timestamp, d.running_requests, d.accept_length, d.gen_throughput) for d in out] == [
        (ts("03-01 10:00:00"), 2, None, 5.0)]


def test_prefixes_colour_and_containers():
    line = g.spec_line("0.10.2", accepted=10, drafted=30, positions=[0.5, 0.3, 0.2])
    coloured = line.replace("(APIServer pid=7)", "\x1b[1;36m(APIServer pid=7)\x1b[0;0m")
    assert parse(coloured) == parse(line) and type(parse(line)) is VllmSpecDecoding
    import re

    assert parse_line("vllm-1  | " + line, now=NOW) == parse(line)
    assert parse_line("2026-03-01T10:00:10Z stdout F " + line, container_prefix=re.compile(r"\S+ std(?:out|err) [FP] "),
                      now=NOW) == parse(line)
    ray = line.replace("(APIServer pid=7)", "(RayWorkerWrapper pid=3, ip=10.0.0.2)")
    assert type(parse(ray)) is VllmSpecDecoding


def test_injected_text_is_never_read():
    """Request logs print the prompt with %r after `Received request …`; access logs and prints
    from other processes never start with the header."""
    spec = g.spec_line("0.10.2", accepted=0, drafted=300, positions=[0.0, 0.0, 0.0])
    body = spec.split("] ", 1)[1]
    for line in (
        f"(APIServer pid=7) INFO 03-01 10:00:10 [logger.py:39] Received request cmpl-1: prompt: {body!r}, params: …",
        f"(APIServer pid=7) INFO:     1.2.3.4:5 - \"POST /v1/completions?{body} HTTP/1.1\" 200 OK",
        f"INFO 03-01 10:00:10 [logger.py:39] user said: {body}",
        f"(APIServer pid=7) {body}",
        f"xx {spec}",
    ):
        assert type(parse(line)) is OtherLine, line
        assert type(any_engine(line)) is OtherLine


def test_year_is_inferred_from_the_clock():
    line = g.spec_line("0.10.2", accepted=1, drafted=3, positions=[0.3, 0.0, 0.0], ts="12-31 23:59:50")
    jan = datetime(2027, 1, 1, 0, 0, 5).timestamp()
    assert parse_line(line, now=jan).timestamp == datetime(2026, 12, 31, 23, 59, 50).timestamp()
    assert parse_line(line, now=datetime(2026, 12, 31, 23, 59, 55).timestamp()).timestamp == datetime(2026, 12, 31, 23, 59, 50).timestamp()
    bad = line.replace("12-31", "13-31")
    assert type(parse(bad)) is MalformedLine


def test_engine_config_forms():
    a = parse(g.config_line("0.6.6", draft="[ngram]", method=None, k=5)).args
    assert (a["speculative_algorithm"], a["speculative_draft_model_path"], a["num_speculative_tokens"]) == ("NGRAM", None, 5)
    a = parse(g.config_line("0.33.0", method=None, draft=None)).args
    assert a["speculative_algorithm"] is None and a["model_path"] == "/models/target"
    a = parse(g.config_line("0.33.0", method="deepseek_mtp", draft="/m", k=1, tp=8, dp=2)).args
    assert (a["speculative_algorithm"], a["tp_size"], a["dp_size"], a["vllm_version"]) == ("MTP", 8, 2, "0.33.0")
    assert [algorithm(m) for m in ("eagle3", "eagle", "qwen3_next_mtp", "ngram_gpu", "draft_model", "dflash", "suffix", None)] == [
        "EAGLE3", "EAGLE", "MTP", "NGRAM", "STANDALONE", "DFLASH", "SUFFIX", None]


def test_maybe_event_lets_every_form_through():
    lines = [g.config_line("0.33.0"), g.stats_line("0.6.6", running=1, waiting=0, gen=1.0, kv=1.0),
             g.v0_spec_line("0.5.0", k=2, accepted=1, draft=2, emitted=2), g.spec_line("0.8.3", accepted=1, drafted=3, positions=[0.3, 0, 0])]
    assert all(maybe_event(line) for line in lines)
    assert not maybe_event('INFO:     1.2.3.4:5 - "POST /v1/completions HTTP/1.1" 200 OK')
    assert all(type(any_engine(line)) is not OtherLine for line in lines)
    assert isinstance(assemble(lines[2:3])[0], DecodeBatch)
