"""Reading checkpoints: formats, headers, bounded samples, and headers that lie."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from checkpoints import H, V, VD, hot_ids, target_lm_head, variant
from conftest import CK, one, path
from specwatch.probes import d2t_encoding, shape_mismatch, unloaded_weights, weight_values
from specwatch.probes.checkpoint import CheckpointError, load_draft, load_target, read_raw_header


def test_formats_and_flat_config():
    assert load_draft(CK / "speculators-eagle3").format == "speculators"
    assert load_draft(CK / "specforge").format == "sglang"
    assert load_draft(CK / "safeailab-eagle3").format == "eagle"
    spec = load_draft(CK / "speculators-eagle3")
    assert spec.hidden_size == H and spec.draft_vocab_size == VD and spec.vocab_size == V
    assert spec.target_hidden_size == H  # target_hidden_size null → H
    assert spec.flat["architectures"] == ["Eagle3DraftModel"] and "speculators_config" not in spec.flat


def test_headers_without_loading_and_bf16_values():
    ck = load_draft(CK / "speculators-eagle3")
    assert ck.tensors["fc.weight"].dtype == "BF16" and ck.tensors["fc.weight"].shape == (H, 3 * H)
    assert ck.tensors["d2t"].dtype == "I64" and ck.tensors["t2d"].dtype == "BOOL"
    assert "d2t" in ck.tensors and ck.tensors["d2t"].shape == (VD,)
    head = ck.values("lm_head.weight")  # BF16 widened to float32 exactly
    want = target_lm_head()[hot_ids()]
    assert head.dtype == np.float32 and head.shape == (VD, H)
    assert np.allclose(head, want, atol=1e-2)
    sample = ck.values("fc.weight", 1000)  # bounded: whole rows from 4 places
    assert sample.ndim == 1 and 0 < sample.size <= 1000
    f16 = load_draft(CK / "specforge").values("fc.weight", 500)
    assert f16.dtype == np.float32 and f16.size <= 500


def test_target_text_config_of_a_vlm_wrapper():
    t = load_target(CK / "target-kimi-vlm" / "config.json")
    assert t.architecture == "KimiK25ForConditionalGeneration"
    assert (t.hidden_size, t.vocab_size, t.num_hidden_layers) == (64, 256, 8)
    assert t.store is None
    assert load_target(CK / "target-llama").lm_head_name() == "lm_head.weight"
    with pytest.raises(CheckpointError):
        load_target(CK / "nope")
    with pytest.raises(CheckpointError):
        load_draft(CK / "nope")


def _write(p, header: bytes, data: bytes = b"", length: int | None = None):
    p.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)


def _hdr(entries: dict) -> bytes:
    return json.dumps(entries).encode()


@pytest.mark.parametrize("case, needle", [
    ("oversized", "over the 100 MB safetensors limit"),
    ("past_end", "runs past the end of the file"),
    ("not_json", "not valid JSON"),
    ("overlap", "overlaps the previous tensor"),
    ("gap", "leaves a gap"),
    ("wrong_size", "needs 16"),
    ("truncated_data", "truncated"),
    ("tiny", "shorter than the 8-byte header length"),
])
def test_lying_headers_become_error_findings(tmp_path, run_probe, case, needle):
    d = tmp_path / case
    shutil.copytree(CK / "specforge", d)
    p = d / "model.safetensors"
    a = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}
    if case == "oversized":
        _write(p, b"{}", length=2 ** 40)
    elif case == "past_end":
        _write(p, b'{"a": 1}', length=4096)
    elif case == "not_json":
        _write(p, b"{not json at all", b"")
    elif case == "overlap":
        _write(p, _hdr({"a": a, "b": {**a, "data_offsets": [8, 24]}}), bytes(24))
    elif case == "gap":
        _write(p, _hdr({"a": {**a, "data_offsets": [4, 20]}}), bytes(20))
    elif case == "wrong_size":
        _write(p, _hdr({"a": {**a, "data_offsets": [0, 12]}}), bytes(12))
    elif case == "truncated_data":
        _write(p, _hdr({"a": a}), bytes(10))
    elif case == "tiny":
        p.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match=needle):
        read_raw_header(p)
    ck = load_draft(d)  # never raises on bad content
    assert ck.tensors == {} and len(ck.store.problems) == 1 and needle in ck.store.problems[0]
    f = one(run_probe(unloaded_weights, d), "unloaded_weights/unreadable_weights")
    assert f.severity == "error" and needle in f.evidence["problem"]


def test_sharded_checkpoint_and_missing_shard(tmp_path):
    from specwatch.fixes.safetensors_io import write_safetensors

    src = load_draft(CK / "specforge")
    d = tmp_path / "sharded"
    d.mkdir()
    shutil.copy(CK / "specforge" / "config.json", d / "config.json")
    names = sorted(src.tensors)
    half = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in half.items():
        write_safetensors(d / fname, {k: src.store.raw(k) for k in keys})
    index = {"metadata": {}, "weight_map": {k: f for f, ks in half.items() for k in ks}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    ck = load_draft(d)
    assert ck.store.problems == [] and set(ck.tensors) == set(names)
    assert np.array_equal(ck.values("d2t"), src.values("d2t"))
    (d / "model-00002-of-00002.safetensors").unlink()
    ck = load_draft(d)
    assert any("missing" in p for p in ck.store.problems)


@pytest.mark.parametrize("case, reason", [
    ("corrupt", "runs past the end of the file"),
    ("missing_shard", "model-00002-of-00002.safetensors: listed in model.safetensors.index.json but missing"),
    ("no_weights", "no weights: neither `*.safetensors` nor `pytorch_model.bin`"),
])
def test_probes_of_tensors_say_not_checked_after_unreadable_weights(tmp_path, run_probe, case, reason):
    """Nothing is judged from the tensors that happen to be readable: a d2t in the lost shard is
    not a missing map, zero tensors are not 'value statistics of 0 tensors'."""
    from specwatch.fixes.safetensors_io import write_safetensors

    d = tmp_path / case
    d.mkdir()
    shutil.copy(CK / "specforge" / "config.json", d / "config.json")
    src = load_draft(CK / "specforge")
    if case == "corrupt":
        _write(d / "model.safetensors", b'{"a": 1}', length=4096)
    elif case == "missing_shard":  # shard 2 (d2t, t2d) lost, shard 1 readable
        shards = {"model-00001-of-00002.safetensors": [k for k in src.tensors if k not in ("d2t", "t2d")],
                  "model-00002-of-00002.safetensors": ["d2t", "t2d"]}
        write_safetensors(d / "model-00001-of-00002.safetensors", {k: src.store.raw(k) for k in shards[
            "model-00001-of-00002.safetensors"]})
        (d / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {k: f for f, ks in shards.items() for k in ks}}))
    for probe, what in ((d2t_encoding, "the vocab map (d2t/t2d)"), (weight_values, "weight values")):
        out = run_probe(probe, d)
        assert [f.id for f in out] == [f"{probe.PROBE_ID}/not_checked"]
        assert out[0].severity == "info" and out[0].title.startswith(f"{what} not checked")
        assert reason in out[0].evidence["reason"]
    shapes = [f.id for f in run_probe(shape_mismatch, d)]
    assert "shape_mismatch/not_checked" in shapes and "shape_mismatch/ok" not in shapes


def test_pickle_without_torch_is_a_clear_finding_never_unpickled(tmp_path, run_probe):
    pytest.importorskip("numpy")
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed: the .bin is read through torch.load(weights_only=True)")
    except ImportError:
        pass
    d = tmp_path / "eagle-bin"
    d.mkdir()
    shutil.copy(CK / "safeailab-eagle3" / "config.json", d / "config.json")
    # a pickle that would run code if unpickled: specwatch must not open it without torch
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04cos\nsystem\n(S'touch /tmp/pwned'\ntR.")
    ck = load_draft(d)
    assert ck.store.format == "bin" and ck.tensors == {}
    f = one(run_probe(unloaded_weights, d), "unloaded_weights/unreadable_weights")
    assert "torch is not installed" in f.title and "never unpickles" in f.title


def test_variant_helper_round_trips_bf16(tmp_path):
    v = variant(CK / "speculators-converted", tmp_path / "v", rename={"layers.0.": "midlayer."}, drop=("t2d",))
    ck = load_draft(v)
    assert "midlayer.self_attn.q_proj.weight" in ck.tensors and "t2d" not in ck.tensors
    assert ck.store.raw("midlayer.self_attn.q_proj.weight") == load_draft(path("speculators-converted")).store.raw(
        "layers.0.self_attn.q_proj.weight")
