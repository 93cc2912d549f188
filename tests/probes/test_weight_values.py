"""weight_values: NaN/Inf, all-zero, constant tensors, and per-tensor statistics on a sample."""

from __future__ import annotations

import numpy as np

from checkpoints import H, INTER, variant
from conftest import CK, ids, one
from specwatch.probes import weight_values


def test_healthy_checkpoints_have_statistics_only(run_probe):
    for draft in ("speculators-eagle3", "specforge"):
        out = run_probe(weight_values, draft)
        assert ids(out) == ["weight_values/statistics"]
    stats = one(run_probe(weight_values, "speculators-eagle3"), "weight_values/statistics").evidence
    assert len(stats) == 15 and "d2t" not in stats
    assert stats["norm.weight"].startswith("n=64 mean=1")  # BF16 norms near 1.0, read exactly


def test_nan_zero_constant_and_untrained_norm(run_probe, tmp_path):
    down = np.full((H, INTER), 0.01, np.float32)
    up = (np.random.default_rng(5).standard_normal((INTER, H)) * 0.02).astype(np.float32)
    up[3, 7] = np.nan
    v = variant(CK / "specforge", tmp_path / "bad", set_tensors={
        "fc.weight": np.zeros((H, 3 * H), np.float32), "midlayer.mlp.down_proj.weight": down,
        "midlayer.mlp.up_proj.weight": up, "norm.weight": np.ones(H, np.float32)}, float_code="F32")
    out = run_probe(weight_values, v)
    assert one(out, "weight_values/nan_inf").evidence["tensors"] == [
        "midlayer.mlp.up_proj.weight: 1 of 8192 sampled values are NaN/Inf"]
    assert one(out, "weight_values/all_zero").evidence["tensors"] == ["fc.weight"]
    assert one(out, "weight_values/constant").evidence["tensors"] == ["midlayer.mlp.down_proj.weight = 0.01"]
    f = one(out, "weight_values/untrained_norm")
    assert f.severity == "warning" and f.evidence["tensors"] == ["norm.weight = 1"]


def test_integer_and_bool_buffers_at_their_initial_values(run_probe, tmp_path):
    v = variant(CK / "specforge", tmp_path / "buf", set_tensors={
        "midlayer.self_attn.position_ids": np.arange(32, dtype=np.int64),  # arange
        "midlayer.attn_mask": np.ones(16, bool),  # all True
        "midlayer.counts": np.zeros(8, np.int32),  # all zeros
        "midlayer.filled": np.array([3, 1, 4, 1, 5], np.int64),  # a real value: not flagged
        "d2t": np.zeros(64, np.int64)})  # the vocab map is d2t_encoding's (it knows Vd and V)
    out = run_probe(weight_values, v)
    f = one(out, "weight_values/initial_buffer")
    assert f.severity == "warning" and f.evidence["tensors"] == [
        "midlayer.attn_mask: all True", "midlayer.counts: all zeros", "midlayer.self_attn.position_ids: arange"]
    stats = one(out, "weight_values/statistics").evidence
    assert stats["midlayer.filled"] == "I64 n=5 min=1 max=5" and "d2t" not in stats
