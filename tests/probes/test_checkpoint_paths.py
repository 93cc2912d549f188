"""A checkpoint's files are read only inside its folder: links and index entries that leave it are
refused (a finding with its fix), never opened, never copied (real symlinks, real safetensors)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from checkpoints import OUT as CK
from specwatch.fixes.safetensors_io import from_numpy, write_safetensors
from specwatch.probes.checkpoint import load_draft
from test_diagnosis import cli

SECRET = "s3cret-0f-another-user"


def secret_file(tmp_path: Path) -> Path:
    """A file outside the draft that no report may quote: a root-only text file."""
    p = tmp_path / "private" / "shadow"
    p.parent.mkdir()
    p.write_text(f"root:{SECRET}:19000:0:99999:7:::\n")
    p.chmod(0o600)
    return p


def secret_safetensors(tmp_path: Path) -> Path:
    """A valid safetensors file outside the draft, whose tensor name is a secret."""
    p = tmp_path / "x"
    write_safetensors(p, {SECRET: from_numpy(np.zeros(4, dtype=np.float32))}, {"format": "pt"})
    return p


def copy_draft(tmp_path: Path, name: str = "specforge") -> Path:
    d = tmp_path / "draft"
    shutil.copytree(CK / name, d)
    return d


def test_a_readme_linking_out_of_the_draft_is_never_copied(sglang_roots, tmp_path):
    secret = secret_file(tmp_path)
    draft = copy_draft(tmp_path, "speculators-converted")
    (draft / "README.md").symlink_to(secret)
    (draft / "NOTICE").symlink_to("/etc/shadow")
    (draft / "tokenizer_config.json").write_text('{"model_max_length": 2048}\n')
    out = tmp_path / "fixed"
    r = cli("fix-checkpoint", "--draft", draft, "--out", out, "--target", CK / "target-llama",
            "--sglang-root", sglang_roots["0.5.23"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer_config.json"]
    assert "skipped README.md: a link that resolves outside the checkpoint folder (not copied" in r.stdout
    assert "skipped NOTICE: a link that resolves outside the checkpoint folder" in r.stdout
    assert all(SECRET.encode() not in p.read_bytes() for p in out.iterdir())


def test_index_entries_and_links_leaving_the_folder_are_findings_never_opened(sglang_roots, tmp_path):
    secret_safetensors(tmp_path)  # tmp_path/x: `../x` from the draft
    draft = copy_draft(tmp_path)
    real = load_draft(draft).tensors
    shard = draft / "model-00001-of-00001.safetensors"
    (draft / "model.safetensors").rename(shard)
    (draft / "model-00002.safetensors").symlink_to(tmp_path / "x")  # a link out, found by the *.safetensors glob
    weight_map = {name: shard.name for name in real}
    weight_map.update({"lm_head.extra": "/etc/shadow", "fc.extra": "../x"})
    (draft / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    r = cli("diagnose", "--draft", draft, "--target", CK / "target-llama", "--sglang-root",
            sglang_roots["0.5.23"], "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    outside = {f["evidence"]["problem"] for f in doc["findings"] if f["id"] == "unloaded_weights/outside_checkpoint"}
    assert outside == {
        "/etc/shadow: listed in model.safetensors.index.json, resolves outside the checkpoint folder: not read",
        "../x: listed in model.safetensors.index.json, resolves outside the checkpoint folder: not read",
    }
    assert all(f["fix"].startswith("Keep every weight file inside the checkpoint folder") for f in doc["findings"]
               if f["id"] == "unloaded_weights/outside_checkpoint")
    assert "header length" not in r.stdout and SECRET not in r.stdout + r.stderr


def test_a_weight_file_linking_out_is_refused(sglang_roots, tmp_path):
    secret_safetensors(tmp_path)
    draft = copy_draft(tmp_path)
    (draft / "extra.safetensors").symlink_to(tmp_path / "x")
    store = load_draft(draft).store
    assert store.outside == ["extra.safetensors: resolves outside the checkpoint folder: not read"]
    assert SECRET not in store.tensors and "midlayer.self_attn.q_proj.weight" in store.tensors


def test_a_config_linking_out_is_not_read(tmp_path):
    draft = copy_draft(tmp_path)
    (draft / "config.json").unlink()
    (draft / "config.json").symlink_to(secret_file(tmp_path))
    ck = load_draft(draft)
    assert ck.config == {} and ck.config_problem == "config.json: resolves outside the checkpoint folder: not read"


def test_links_inside_the_folder_and_a_hugging_face_snapshot_are_read(tmp_path):
    """The hub cache keeps files in `blobs/` and links `snapshots/REV/<name>` to them."""
    repo = tmp_path / "hub" / "models--org--draft"
    snap = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        blob = repo / "blobs" / f"sha-{name}"
        shutil.copy(CK / "specforge" / name, blob)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    ck = load_draft(snap)
    assert ck.config_problem is None and ck.store.problems == [] and len(ck.tensors) == len(load_draft(CK / "specforge").tensors)
    inner = copy_draft(tmp_path)
    (inner / "weights").mkdir()
    (inner / "model.safetensors").rename(inner / "weights" / "model.safetensors")
    (inner / "model.safetensors").symlink_to("weights/model.safetensors")
    assert load_draft(inner).store.problems == []


def test_the_collapse_alert_quotes_nothing_from_outside_the_draft(sglang_roots, tmp_path):
    """The daemon's path (replay runs the same pipeline, diagnosis inline): a draft whose index
    names /etc/shadow yields the finding in the alert's fixes and no byte read from it."""
    from procs import decode_line

    secret_safetensors(tmp_path)
    draft = copy_draft(tmp_path)
    weight_map = {name: "model.safetensors" for name in load_draft(draft).tensors}
    weight_map.update({"lm_head.extra": "/etc/shadow", "fc.extra": "../x"})
    (draft / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    cfg = tmp_path / "config.yaml"
    cfg.write_text(json.dumps({"logs": [{"path": str(tmp_path / "server.log")}],
                               "diagnosis": {"sglang_root": str(sglang_roots["0.5.23"])}}))
    log = tmp_path / "server.log"
    log.write_text(f"[2026-02-23 16:30:00] server_args=ServerArgs(model_path='{CK / 'target-llama'}', "
                   f"speculative_algorithm='EAGLE3', speculative_draft_model_path='{draft}')\n"
                   + "".join(decode_line(1.02, f"16:32:3{i}") for i in range(3)))
    r = cli("replay", log, "--config", cfg, "--json")
    [alert] = [a for a in json.loads(r.stdout)["alerts"] if a["name"] == "AcceptanceCollapse"]
    fixes = "\n".join(alert["fixes"])
    assert "[error] unloaded_weights: weights not read: /etc/shadow: listed in model.safetensors.index.json" in fixes
    assert "header length" not in r.stdout and SECRET not in r.stdout + r.stderr


def test_a_target_config_linking_out_is_not_read(tmp_path):
    from specwatch.probes.checkpoint import CheckpointError, load_target

    target = tmp_path / "target"
    shutil.copytree(CK / "target-llama", target)
    (target / "config.json").unlink()
    (target / "config.json").symlink_to(secret_file(tmp_path))
    for given in (target, target / "config.json"):
        with pytest.raises(CheckpointError, match="target config: config.json: resolves outside the checkpoint folder"):
            load_target(given)
