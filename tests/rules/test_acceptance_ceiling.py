"""Acceptance near its ceiling after a lower steady state (issue #10 item 6), through the real
pipeline; the ceiling from the server's settings as SGLang resolves them."""

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from specwatch.core.metrics import PipelineCollector
from specwatch.rules.acceptance_ceiling import accept_length_ceiling
from timeline import Timeline, feed, names, pipeline, run

ROOT = Path(__file__).resolve().parents[2]
FIRING, RESOLVED = ("AcceptanceNearCeiling", "firing", ""), ("AcceptanceNearCeiling", "resolved", "")


def steady(accept=2.6, n=30, **args) -> Timeline:
    """A server (EAGLE3, 3 steps, topk 1, 4 draft tokens unless overridden) at a steady accept len."""
    return Timeline(**args).decode(n=n, accept=accept)


def test_a_step_up_to_the_ceiling_after_a_steady_state_fires_and_resolves():
    accepts = [2.4, 2.8] * 15  # steady, mean 2.6
    log = Timeline().decode(n=30, accept=lambda i: accepts[i])
    log.decode(n=2, accept=3.9, running=2)
    assert run(log.lines) == []  # two lines near the ceiling are not enough
    log.decode(n=1, accept=3.85, running=2)
    [a] = run(log.lines)
    assert names([a]) == [FIRING] and a.labels["severity"] == "warning"
    ev = dict(a.evidence)
    assert ev["accept len"] == "3.85" and ev["accept len ceiling"] == "4 (speculative_num_steps 3 + 1)"
    assert ev["steady accept len before"] == f"{sum(accepts) / 30:.2f} over 30 decode batches"
    assert ev["decode batches near the ceiling"] == "3" and ev["running requests"] == "2"
    assert a.starts_at == Timeline().wait(2 * 31).t.timestamp()  # the first line near the ceiling
    assert a.annotations["summary"] == ("Accept len jumped to 3.85 on box, 96% of its ceiling 4 (steady 2.60 "
                                        "before): check the output for repetition")
    assert a.fixes[0].startswith("Read what the server generates now")
    # between recover_ratio (3.6) and ratio (3.8): still firing; three lines below 3.6 resolve
    log.decode(n=5, accept=3.7).decode(n=2, accept=2.6)
    assert names(run(log.lines)) == [FIRING]
    log.decode(n=1, accept=2.6)
    t = run(log.lines)
    assert names(t) == [FIRING, RESOLVED] and dict(t[1].evidence)["back to accept len"] == "2.60"


@pytest.mark.parametrize("case", ["always near the ceiling", "step below 95 %", "steady too short",
                                  "steady too high", "idle lines", "no settings"])
def test_quiet(case):
    log = {
        "always near the ceiling": lambda: steady(accept=3.9, n=40),
        "step below 95 %": lambda: steady().decode(n=10, accept=3.75),
        "steady too short": lambda: steady(n=9).decode(n=10, accept=3.95),
        "steady too high": lambda: steady(accept=3.45).decode(n=10, accept=3.95),  # > 0.85 x 4
        "idle lines": lambda: steady().decode(n=10, accept=3.95, running=0),
        "no settings": lambda: Timeline(spec=None).decode(n=30, accept=2.6).decode(n=10, accept=3.95),
    }[case]()
    assert [n for n in names(run(log.lines)) if n[0] == FIRING[0]] == []


def test_a_tree_and_ngram_use_their_own_ceiling():
    # EAGLE tree: 64 draft tokens verified, but one path of at most steps + 1 = 6 accepted
    tree = steady(accept=3.5, speculative_num_steps=5, speculative_eagle_topk=8,
                  speculative_num_draft_tokens=64).decode(n=3, accept=5.8)
    [a] = run(tree.lines)
    assert dict(a.evidence)["accept len ceiling"] == "6 (speculative_num_steps 5 + 1)"
    ngram = steady(accept=3.0, speculative_algorithm="NGRAM", speculative_draft_model_path=None,
                   speculative_num_steps=None, speculative_eagle_topk=None, speculative_num_draft_tokens=8)
    assert run(ngram.decode(n=3, accept=7.0).lines) == []  # 7.0 < 0.95 x 8
    [a] = run(ngram.decode(n=3, accept=7.7).lines)
    assert dict(a.evidence)["accept len ceiling"] == "8 (speculative_num_draft_tokens 8)"


@pytest.mark.parametrize("args,ceiling", [
    ({"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}, 4),
    # topk 1: SGLang sets draft tokens to steps + 1 whatever was typed
    ({"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 8}, 4),
    ({"speculative_num_steps": 5, "speculative_eagle_topk": 8, "speculative_num_draft_tokens": 64}, 6),
    ({"speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 4}, 4),
    ({"speculative_num_steps": 2}, 3),
    ({"speculative_num_draft_tokens": 5}, 5),
    ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 16, "speculative_num_steps": 4}, 16),
    ({"speculative_algorithm": "NGRAM"}, 12),
    ({"speculative_algorithm": None, "speculative_num_steps": 3}, None),
    ({}, None),
    ({"speculative_num_steps": 0, "speculative_num_draft_tokens": 1}, None),
])
def test_ceiling_from_settings(args, ceiling):
    args = {"speculative_algorithm": "EAGLE3", **args}
    got = accept_length_ceiling(args)
    assert (got and got[0]) == ceiling


def test_the_ceiling_rules_are_sglangs():
    """The facts `accept_length_ceiling` cites, in the SGLang sources on disk."""
    root = ROOT / ".cache" / "sglang-0.5.23" / "sglang" / "srt"
    if not root.is_dir():
        pytest.skip("SGLang 0.5.23 sources not installed under .cache/")
    hook = (root / "arg_groups" / "speculative_hook.py").read_text()
    assert ("cfg.speculative_eagle_topk == 1\n        and cfg.speculative_num_draft_tokens != "
            "cfg.speculative_num_steps + 1") in hook
    assert "speculative_num_draft_tokens=cfg.speculative_num_steps + 1," in hook
    assert "speculative_num_draft_tokens=12," in hook  # the NGRAM default
    reporter = (root / "managers" / "scheduler_components" / "metrics_reporter.py").read_text()
    assert "spec_accept_length = self.spec_num_accept_tokens / self.spec_num_forward_ct" in reporter
    assert "draft_per_round = get_spec().speculative_num_draft_tokens - 1" in reporter


def test_a_restart_resolves_and_the_state_survives_a_specwatch_restart():
    p = pipeline()
    log = steady().decode(n=3, accept=3.9)
    assert names(feed(p, log.lines)) == [FIRING]
    q = pipeline()
    q.load_state(p.to_state())
    more = Timeline(start=log.ts, spec=None).decode(n=3, accept=2.5)
    [r] = feed(q, more.lines)
    assert names([r]) == [RESOLVED]
    # firing again, then the server restarts
    again = Timeline(start=more.ts, spec=None).decode(n=20, accept=2.6).decode(n=3, accept=3.9)
    assert names(feed(q, again.lines)) == [FIRING]
    restart = [n for n in names(feed(q, Timeline(start=again.wait(60).ts).lines)) if n[0] == FIRING[0]]
    assert restart == [RESOLVED]


def test_the_ceiling_is_exported_for_the_prometheus_rule():
    p = pipeline()
    feed(p, steady(n=1, speculative_num_steps=5, speculative_eagle_topk=8, speculative_num_draft_tokens=64).lines)
    reg = CollectorRegistry()
    reg.register(PipelineCollector(p))
    text = generate_latest(reg).decode()
    assert 'specwatch_accept_length_ceiling{server="box"} 6.0' in text
