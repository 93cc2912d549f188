"""A vLLM server's collapse advice names only what works on vLLM: `specwatch fix-checkpoint` writes
SGLang's checkpoint layout (it has no vLLM mode), so no vLLM alert suggests it."""

from __future__ import annotations

import numpy as np

from checkpoints import OUT as CKPT
from checkpoints import variant
from specwatch.alerts.dispatcher import Dispatcher
from specwatch.config import build_config
from specwatch.pipeline import Pipeline
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
