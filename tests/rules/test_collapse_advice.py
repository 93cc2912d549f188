"""The collapse alert's advice fits the server: fixes by speculative algorithm and by history,
evidence with the load and the settings that matter (issue #10 item 4)."""

from pathlib import Path

from specwatch.core.events import DecodeBatch
from specwatch.rules.collapse import _utc, known_causes
from specwatch.engines.sglang.log import parse_line
from timeline import Timeline, feed, names, pipeline, run

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "samples"
CHECKPOINT_CHECKS = ("specwatch diagnose", "midlayer", "set_eagle3_layers_to_capture", "d2t", "fc.weight")


def episodes(lines: list[str], threshold: float = 1.10) -> list[DecodeBatch]:
    """The third low decode line of each run of low lines: where the default rule fires."""
    out, run_ = [], 0
    for line in lines:
        ev = parse_line(line)
        if not isinstance(ev, DecodeBatch):
            continue
        run_ = run_ + 1 if ev.accept_length <= threshold else 0
        if run_ == 3:
            out.append(ev)
    return out


def test_br28_nextn_server_gets_advice_for_its_head_and_its_history():
    """BR-28: NEXTN (no EAGLE-3 draft), max_running_requests=4, three episodes that recover by
    themselves. No EAGLE-3 checkpoint checks; the queue and the full batch in the evidence; from
    the second episode on, the earlier recovery leads the fixes."""
    lines = (SAMPLES / "bugreport-logs" / "BR-28.log").read_text().splitlines()
    tips = episodes(lines)
    assert len(tips) == 3
    t = run(lines)
    assert names(t) == [("AcceptanceCollapse", s, "TP0") for s in ("firing", "resolved") * 3]
    fired, resolved = t[0::2], t[1::2]
    for i, (a, tip) in enumerate(zip(fired, tips)):
        ev = dict(a.evidence)
        assert ev["queued requests"] == str(tip.queued_requests) and tip.queued_requests >= 12
        assert ev["running requests"] == "4" and ev["decode batch"] == "4 of 4 requests (full)"
        assert ev["speculative_algorithm"] == "NEXTN" and ev["max_running_requests"] == "4"
        assert "the MTP head costs time" in a.annotations["description"]
        assert not [f for f in a.fixes if any(c in f for c in CHECKPOINT_CHECKS)], a.fixes
        head = next(f for f in a.fixes if f.startswith("`NEXTN` drafts with a head built into the target"))
        assert "/models/Qwen3.8-Flash-Next-NVFP4" in head
        load = next(f for f in a.fixes if f.startswith("Load:"))
        assert f"4 of 4 requests (full: max_running_requests) and {tip.queued_requests} wait" in load
        if i == 0:
            assert a.fixes[0] is head and "earlier episodes recovered without a restart" not in ev
        else:
            assert ev["earlier episodes recovered without a restart"] == str(i)
            assert a.fixes[0].startswith(f"Acceptance recovered by itself {i} time(s) on this server without "
                                         f"a restart (last at {_utc(resolved[i - 1].ends_at)}): the MTP head loads")
            assert a.fixes[1] is load and a.fixes.index(head) > 1


def test_an_eagle3_server_still_gets_the_checkpoint_checks_first():
    log = Timeline().decode(n=3, accept=1.0, running=12, queued=0)
    [a] = run(log.lines)
    assert a.fixes[0].startswith("Run the whole diagnosis") and "--algorithm EAGLE3" in a.fixes[0]
    assert [f.split(":")[0] for f in a.fixes[1:]] == ["Unloaded draft weights", "Missing aux hidden-state capture",
                                                      "fc bypass", "d2t map"]
    ev = dict(a.evidence)
    assert ev["decode batch"] == "12 of 64 requests" and ev["queued requests"] == "0"
    # after an episode that recovered by itself, runtime state leads; the checks stay
    log.decode(n=3, accept=2.8).decode(n=3, accept=1.0, running=64, queued=7)
    t = run(log.lines)
    assert names(t)[1:] == [("AcceptanceCollapse", "resolved", ""), ("AcceptanceCollapse", "firing", "")]
    again = t[2]
    assert again.fixes[0].startswith("Acceptance recovered by itself 1 time(s)") and "the draft loads" in again.fixes[0]
    assert again.fixes[1].startswith("Load: the decode batch holds 64 of 64 requests (full: max_running_requests) "
                                     "and 7 wait")
    assert again.fixes[2].startswith("Run the whole diagnosis")


def test_settings_that_matter_and_a_dp_attention_change_at_restart():
    """DP attention splits max_running_requests among the DP ranks; a value changed at the last
    restart is named with the old one; a restart ends an episode without counting as a recovery."""
    log = Timeline(enable_dp_attention=False, dp_size=2, enable_hierarchical_cache=True)
    log.decode(n=3, accept=1.0, running=20)
    log.wait(60).server_args(enable_dp_attention=True, dp_size=2, enable_hierarchical_cache=True)
    log.decode(n=3, accept=1.0, running=32, queued=3)
    t = run(log.lines)
    assert names(t) == [("AcceptanceCollapse", "firing", ""), ("AcceptanceCollapse", "resolved", ""),
                        ("AcceptanceCollapse", "firing", "")]
    first, second = t[0], t[2]
    assert dict(first.evidence)["decode batch"] == "20 of 64 requests"
    assert any(f.startswith("Cache: `enable_hierarchical_cache` is on") for f in first.fixes)
    ev = dict(second.evidence)
    assert ev["enable_dp_attention"] == "True (was False before the restart)"
    assert ev["decode batch"] == "32 of 32 requests (full)"  # 64 // dp_size 2 per rank
    assert ev["enable_hierarchical_cache"] == "True" and ev["dp_size"] == "2"
    assert "earlier episodes recovered without a restart" not in ev  # resolved by the restart
    assert "Changed at the last restart: `enable_dp_attention` `False` → `True`. If acceptance was healthy " \
           "before, try the old value." in second.fixes
    assert second.fixes[0].startswith("Run the whole diagnosis")  # no recovery: the checkpoint first


def test_recoveries_count_per_checkpoint_and_survive_a_specwatch_restart():
    p = pipeline()
    log = Timeline().decode(n=3, accept=1.0).decode(n=3, accept=2.8)
    assert [s for _, s, _ in names(feed(p, log.lines))] == ["firing", "resolved"]
    q = pipeline()
    q.load_state(p.to_state())
    more = Timeline(start=log.ts, spec=None).decode(n=3, accept=1.0).decode(n=3, accept=2.8)
    [fired, _] = feed(q, more.lines)
    assert fired.fixes[0].startswith("Acceptance recovered by itself 1 time(s)")
    # a new draft: what the old one did says nothing about it
    new = Timeline(start=more.ts, speculative_draft_model_path="/models/other-eagle3").decode(n=3, accept=1.0)
    [fired] = feed(q, new.lines)
    assert fired.fixes[0].startswith("Run the whole diagnosis") and "/models/other-eagle3" in fired.fixes[0]
    assert "earlier episodes recovered without a restart" not in dict(fired.evidence)


def test_fixes_by_algorithm():
    ngram = known_causes({"speculative_algorithm": "NGRAM", "model_path": "/m/t"})
    assert ngram[0].startswith("NGRAM drafts from n-grams") and "nothing to check on disk" in ngram[0]
    assert not [f for f in ngram if any(c in f for c in CHECKPOINT_CHECKS + ("safetensors",))]
    standalone = known_causes({"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": "/m/d",
                               "model_path": "/m/t"})
    assert standalone[0].startswith("`STANDALONE` drafts with a separate model") and "tokenizer.json" in standalone[0]
    assert "/m/d /m/t`" in standalone[0]
    assert not [f for f in standalone if any(c in f for c in CHECKPOINT_CHECKS)]
    mtp = known_causes({"speculative_algorithm": "MTP", "model_path": "/m/t"})
    assert mtp[0].startswith("`MTP` drafts with a head built into the target") and "/m/t`" in mtp[0]
    for algo in ("EAGLE", "EAGLE3", None):
        assert known_causes({"speculative_algorithm": algo})[0].startswith("Run the whole diagnosis")


def test_a_restart_forgets_the_recoveries_before_it():
    """An episode that recovered by itself, then a server restart: the next collapse's advice does
    not count that recovery ("recovered by itself 1 time(s)" described the old process)."""
    log = Timeline().decode(n=3, accept=2.8).decode(n=3, accept=1.0).decode(n=3, accept=2.8)
    log.wait(60).server_args().decode(n=3, accept=1.0)
    t = run(log.lines)
    assert names(t) == [("AcceptanceCollapse", s, "") for s in ("firing", "resolved", "firing")]
    after = t[2]
    assert "earlier episodes recovered without a restart" not in dict(after.evidence)
    assert not any(f.startswith("Acceptance recovered by itself") for f in after.fixes)
    assert after.fixes[0].startswith("Run the whole diagnosis")  # a fresh process, collapsed from its start


def test_a_collapse_after_hours_of_healthy_serving_points_at_runtime_state_and_a_restart():
    """An MTP server healthy for two hours, then a collapse (as in a public MTP report: about 14.5k
    tokens into serving), which a restart clears; later it collapses again. Both times the
    advice leads with runtime state and the restart, not with checkpoint checks; an MTP server
    never gets EAGLE-3 ones."""
    mtp = {"speculative_algorithm": "NEXTN", "speculative_draft_model_path": None, "model_path": "/models/glm"}
    log = Timeline(**mtp).decode(n=250, every=30, accept=2.6).decode(n=3, accept=1.02)
    log.wait(60).server_args(**mtp).decode(n=20, every=30, accept=2.6).decode(n=3, accept=1.02)
    t = run(log.lines)
    assert names(t) == [("AcceptanceCollapse", s, "") for s in ("firing", "resolved", "firing")]
    first, again = t[0], t[2]
    assert first.fixes[0].startswith("Acceptance was healthy on this rank for 2h 0"), first.fixes[0]
    assert "the MTP head loads and works" in first.fixes[0] and "restart the server" in first.fixes[0]
    assert again.fixes[0].startswith("The last episode on this server ended with a restart (at ")
    for a in (first, again):
        assert any(f.startswith("`NEXTN` drafts with a head built into the target") for f in a.fixes)
        assert not any(c in f for f in a.fixes for c in CHECKPOINT_CHECKS)
    # an EAGLE-3 server healthy for hours: runtime state first, its checkpoint checks after it
    eagle = Timeline().decode(n=250, every=30, accept=2.6).decode(n=3, accept=1.02)
    [a] = run(eagle.lines)
    assert a.fixes[0].startswith("Acceptance was healthy on this rank for 2h 0")
    assert a.fixes[1].startswith("Run the whole diagnosis")
    # healthy for less than rules.collapse.healthy_before (30m): the checkpoint first, as before
    short = Timeline().decode(n=20, every=30, accept=2.6).decode(n=3, accept=1.02)
    [a] = run(short.lines)
    assert a.fixes[0].startswith("Run the whole diagnosis")


def test_vllm_mtp_methods_by_name_get_mtp_head_advice():
    """vLLM names MTP methods per model (`deepseek_mtp`, `qwen3_next_mtp`, ...): all are MTP heads."""
    for algo in ("DEEPSEEK_MTP", "QWEN3_NEXT_MTP"):
        fixes = known_causes({"engine": "vllm", "speculative_algorithm": algo, "model_path": "/m"})
        assert fixes[0].startswith("MTP drafts with a head inside the target checkpoint"), algo
