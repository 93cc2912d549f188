"""fc_bypass: H-wide hidden states skip the draft's fc."""

from __future__ import annotations

import json
import shutil

import numpy as np

from checkpoints import H, variant
from conftest import CK, one
from specwatch.probes import fc_bypass


def test_eagle_algorithm_with_an_eagle3_draft(run_probe):
    f = one(run_probe(fc_bypass, "specforge", algorithm="EAGLE"), "fc_bypass/bypassed")
    assert f.severity == "error"
    assert f.evidence["fc.weight"] == [64, 192] and f.evidence["hidden width fed to the draft"] == 64
    assert f.fix == "Start the server with --speculative-algorithm EAGLE3."
    assert run_probe(fc_bypass, "specforge", algorithm="EAGLE3") == []
    assert run_probe(fc_bypass, "specforge") == []  # algorithm unknown: nothing says capture is off


def test_capture_turned_off_or_single_layer(run_probe, tmp_path):
    off = variant(CK / "specforge", tmp_path / "off", config={"eagle_config": {"use_aux_hidden_state": False}})
    f = one(run_probe(fc_bypass, off, algorithm="EAGLE3"), "fc_bypass/bypassed")
    assert f.evidence["why"] == ["eagle_config.use_aux_hidden_state is false in the draft config"]
    single = variant(CK / "specforge", tmp_path / "one", config={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [3]}})
    f = one(run_probe(fc_bypass, single, algorithm="EAGLE3"), "fc_bypass/bypassed")
    assert "only 1 layer captured" in f.evidence["why"][0]


def test_wider_target_is_a_loud_mismatch_not_a_bypass(run_probe, tmp_path):
    rng = np.random.default_rng(4)
    v = variant(CK / "specforge", tmp_path / "wide", config={"target_hidden_size": 128},
                set_tensors={"fc.weight": (rng.standard_normal((H, 384)) * 0.02).astype(np.float32)})
    t = tmp_path / "t"
    shutil.copytree(CK / "target-llama", t)
    (t / "config.json").write_text(json.dumps(json.loads((t / "config.json").read_text()) | {"hidden_size": 128}))
    f = one(run_probe(fc_bypass, v, target=t, algorithm="EAGLE"), "fc_bypass/width_mismatch")
    assert f.evidence["hidden width fed to the draft"] == 128 and "fails" in f.title
