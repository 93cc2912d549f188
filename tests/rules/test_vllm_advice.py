"""A vLLM server's collapse advice names only what works on vLLM: `specwatch fix-checkpoint` writes
SGLang's checkpoint layout (it has no vLLM mode), so no vLLM alert suggests it."""

from __future__ import annotations

import numpy as np

from checkpoints import OUT as CKPT
from checkpoints import variant
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import build_config
from specwatch.core.pipeline import Pipeline
from specwatch.probes.checkpoint import load_draft
from test_vllm_reports import VllmLog
from timeline import feed, names


def test_a_vllm_collapse_with_absolute_d2t_never_suggests_fix_checkpoint(vllm_facts, tmp_path):
    offsets = np.asarray(load_draft(CKPT / "specforge").values("d2t")).astype(np.int64)
    draft = variant(CKPT / "specforge", tmp_path / "abs", set_tensors={"d2t": offsets + np.arange(len(offsets))})
    log = VllmLog(version="0.33.0", method="eagle3", draft=str(draft), model=str(CKPT / "target-llama"), k=3)
    log.interval(4, positions=[0.0, 0.0, 0.0])
    cfg = build_config({"server": "box", "logs": [{"path": "server.log"}],
                        "diagnosis": {"vllm_root": str(vllm_facts["0.33.0"].root)}})
    p = Pipeline(cfg, Dispatcher([], group_wait=0, group_interval=0, keep_history=True), diagnosis_background=False)
    t = feed(p, log.lines)
    assert names(t) == [("AcceptanceCollapse", "firing", "")]
    fixes = t[0].fixes
    assert fixes[0].startswith("[error] vllm_d2t: vLLM reads d2t as offsets") and "`d2t = d2t - arange(len(d2t))`" in fixes[0]
    assert any(f.startswith("d2t map: vLLM reads `d2t` as offsets") and "d2t[i] = target_id[i] - i" in f for f in fixes)
    assert not [f for f in fixes if "fix-checkpoint" in f]


def test_no_vllm_collapse_advice_of_any_draft_kind_names_fix_checkpoint():
    """Every algorithm a vLLM server may run (EAGLE, EAGLE-3, MTP heads, n-gram, a draft model,
    none known), paths known or not: the collapse's causes and the runtime checks are vLLM's."""
    from specwatch.core.events import DecodeBatch
    from specwatch.rules.collapse import known_causes, runtime_causes

    batch = DecodeBatch(timestamp=0.0, rank="", ranks={}, fields={}, engine="vllm", running_requests=8, queued_requests=0, accept_length=1.0,
                        accept_rate=0.0, gen_throughput=100.0)
    for algo in ("eagle", "eagle3", "EAGLE3", "deepseek_mtp", "mtp", "ngram", "draft_model", None):
        for paths in ({}, {"speculative_draft_model_path": "/m/draft", "model_path": "/m/target"}):
            args = {"engine": "vllm", "speculative_algorithm": algo, **paths}
            fixes = known_causes(args) + runtime_causes(args, batch, recovered=1, last_recovered=0.0)
            assert fixes and not [f for f in fixes if "fix-checkpoint" in f], (algo, paths)
    # the SGLang EAGLE-3 advice does suggest it: the check above can see it
    assert any("fix-checkpoint" in f for f in known_causes({"speculative_algorithm": "EAGLE3"}))
