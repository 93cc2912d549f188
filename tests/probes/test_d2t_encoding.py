"""d2t_encoding: the vocabulary map as SGLang reads it (offsets)."""

from __future__ import annotations

import numpy as np
import pytest

from checkpoints import V, VD, hot_ids, variant
from conftest import CK, ids, one
from specwatch.probes import d2t_encoding


def test_offsets_confirmed_by_the_frozen_head(run_probe):
    out = run_probe(d2t_encoding, "speculators-eagle3")
    f = one(out, "d2t_encoding/head_confirms")
    assert f.evidence["rows equal to target[i + d2t[i]]"] == "100%" and f.evidence["target tensor"] == "lm_head.weight"
    f = one(run_probe(d2t_encoding, "specforge"), "d2t_encoding/ok")
    assert f.evidence["len(d2t)"] == VD and f.evidence["t2d.sum()"] == VD and f.evidence["target vocab"] == V


def test_full_vocab_without_map_is_fine(run_probe):
    assert run_probe(d2t_encoding, "speculators-fullvocab") == []


def test_absolute_ids(run_probe, tmp_path):
    v = variant(CK / "speculators-eagle3", tmp_path / "abs", set_tensors={"d2t": hot_ids()})
    f = one(run_probe(d2t_encoding, v), "d2t_encoding/absolute_ids")
    assert f.severity == "error" and f.evidence["d2t[:5]"] == hot_ids()[:5].tolist()
    assert f.evidence["agrees with t2d"] is True and "fix-checkpoint" in f.fix
    # without t2d, the frozen head still tells: lm_head[i] == target[d2t[i]]
    v2 = variant(CK / "speculators-eagle3", tmp_path / "abs2", drop=("t2d",), set_tensors={"d2t": hot_ids()})
    assert "d2t_encoding/absolute_ids" in ids(run_probe(d2t_encoding, v2))


def test_arange_zero_and_missing_maps(run_probe, tmp_path):
    out = run_probe(d2t_encoding, variant(CK / "specforge", tmp_path / "a", set_tensors={"d2t": np.arange(VD, dtype=np.int64)}))
    assert one(out, "d2t_encoding/arange_default").severity == "error"
    out = run_probe(d2t_encoding, variant(CK / "specforge", tmp_path / "z", set_tensors={"d2t": np.zeros(VD, np.int64)}))
    f = one(out, "d2t_encoding/zero_map")
    assert f.severity == "error" and "rebuilds d2t from t2d" in f.fix
    out = run_probe(d2t_encoding, variant(CK / "specforge", tmp_path / "m", drop=("d2t",)))
    f = one(out, "d2t_encoding/missing_map")
    assert f.evidence == {"draft_vocab_size": VD, "target vocab": V, "t2d present": True}


def test_length_dtype_range_and_t2d(run_probe, tmp_path):
    d2t = hot_ids() - np.arange(VD)
    out = run_probe(d2t_encoding, variant(CK / "specforge", tmp_path / "l", set_tensors={"d2t": d2t[:-1].copy()}))
    assert one(out, "d2t_encoding/length").evidence["len(d2t)"] == VD - 1
    assert one(out, "d2t_encoding/lm_head_rows").severity == "error"
    out = run_probe(d2t_encoding, variant(CK / "specforge", tmp_path / "f", set_tensors={"d2t": d2t.astype(np.float32)}))
    assert one(out, "d2t_encoding/dtype").evidence == {"dtype": "F16"}
    big = d2t.copy()
    big[-1] = V  # i + d2t[i] past the vocabulary
    out = run_probe(d2t_encoding, variant(CK / "specforge", tmp_path / "r", set_tensors={"d2t": big}))
    assert one(out, "d2t_encoding/out_of_range").evidence["out of range"] == 1
    t2d = np.zeros(V, bool)
    t2d[:VD] = True
    out = run_probe(d2t_encoding, variant(CK / "specforge", tmp_path / "t", set_tensors={"t2d": t2d}))
    assert one(out, "d2t_encoding/t2d_mismatch").severity == "warning"
    out = run_probe(d2t_encoding, variant(CK / "specforge", tmp_path / "t2", set_tensors={"t2d": np.ones(V, bool)}))
    assert one(out, "d2t_encoding/t2d_shape").evidence["t2d.sum()"] == V


IDENTITY = np.arange(V) < VD  # t2d marking the first Vd ids: an identity fill, no mapping


@pytest.mark.parametrize("t2d, state", [
    (np.zeros(V, bool), "all False"),  # speculators _init_vocab (model.py@v0.7.0), SafeAILab cnets.py
    (np.ones(V, bool), "all True"),  # SpecForge llama3_eagle.py constructor
    (IDENTITY, f"True exactly at ids 0..{VD - 1}"),  # consistent with d2t == 0, still no mapping
    (None, "absent"),
])
def test_buffers_left_at_their_initial_values(run_probe, tmp_path, t2d, state):
    sets = {"d2t": np.zeros(VD, np.int64)} | ({"t2d": t2d} if t2d is not None else {})
    v = variant(CK / "specforge", tmp_path / "init", set_tensors=sets, drop=() if t2d is not None else ("t2d",))
    out = run_probe(d2t_encoding, v)
    f = one(out, "d2t_encoding/zero_map")
    assert f.severity == "error" and f.evidence["initial values"] == {"d2t": "all zeros", "t2d": state}
    assert "fix-checkpoint" not in f.fix and "d2t_encoding/ok" not in ids(out)
    if state in ("all False", "all True"):
        assert f"({state}: its initial value, never filled)" in one(out, "d2t_encoding/t2d_shape").title


def test_full_vocab_identity_is_right(run_probe, tmp_path):
    """Vd == V: d2t all zeros is the identity SGLang needs, t2d all True marks every id."""
    v = variant(CK / "speculators-fullvocab", tmp_path / "full", set_tensors={
        "d2t": np.zeros(V, np.int64), "t2d": np.ones(V, bool)})
    f = one(run_probe(d2t_encoding, v), "d2t_encoding/head_confirms")  # and nothing else
    assert ids(run_probe(d2t_encoding, v)) == ["d2t_encoding/head_confirms"]
    assert f.evidence["rows equal to target[i + d2t[i]]"] == "100%"
