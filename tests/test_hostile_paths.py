"""Values from logs, checkpoints and APIs are data in every suggested command (shell-quoted) and
in every Slack field (escaped for mrkdwn), whatever they hold (issue #10 item 21)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors import safe_open

from procs import wait_for
from specwatch.alerts.model import Alert, Notification, code, split_code
from specwatch.notifiers.slack import build_notification_payload, build_payload
from specwatch.probes.base import fix_checkpoint_command
from specwatch.rules.collapse import known_causes
from specwatch.rules.server_state import _cmd
from specwatch_daemon import SpecwatchDaemon

DATA = Path(__file__).resolve().parent / "data"
# Shell syntax, both quotes, backticks and every mrkdwn formatting character, at word edges.
HOSTILE = "my draft;$(touch pwned) `touch pwned2` *b* _i_ ~s~ 'q' \"d\" <!channel> &amp;"
FORMATTING = ("*b*", "_i_", "~s~", "<!channel>")


def run_in_bash(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """`command` as a user pastes it into bash; `specwatch`, `huggingface-cli` and `pip` print
    their arguments (NUL-separated) instead of running, `python` is this interpreter."""
    stubs = ("specwatch() { printf '%s\\0' \"$@\"; }; pip() { :; }; "
             "huggingface-cli() { printf '%s' \"$PWD/hub\"; }; "
             f"python() {{ {shlex.quote(sys.executable)} \"$@\"; }}; ")
    return subprocess.run(["bash", "-c", stubs + command], cwd=cwd, capture_output=True, text=True, timeout=60)


def commands(fixes: list[str]) -> list[str]:
    return [part for f in fixes for is_code, part in split_code(f)
            if is_code and part.startswith(("specwatch ", "python "))]


def test_code_spans_hold_any_value_exactly():
    for value in ("ls", "a`b", "`x", "x`` y`", " a ", "``", HOSTILE):
        text = f"see {code(value)} and `static`"
        assert split_code(text) == [(False, "see "), (True, value), (False, " and "), (True, "static")]


def test_every_suggested_command_runs_with_the_path_as_one_argument(tmp_path):
    """The collapse's known causes and the probes' fix-checkpoint command, pasted into bash
    with a draft folder whose name is shell syntax: each path arrives as one argument, the
    checks read the real checkpoint, nothing else runs."""
    draft = tmp_path / HOSTILE.replace("/", "")
    shutil.copytree(DATA / "checkpoints" / "speculators-eagle3", draft)
    target = tmp_path / "tgt `x` $HOME"
    fixes = known_causes({"speculative_draft_model_path": str(draft), "model_path": str(target),
                          "speculative_algorithm": "EAGLE3"})
    fixes.append("Fix: " + fix_checkpoint_command(draft))
    cmds = commands(fixes)
    # diagnose, the keys check, fix-checkpoint (a template), the d2t check, the bare
    # `specwatch fix-checkpoint` named in its text, the probes' fix-checkpoint
    assert len(cmds) == 6
    with safe_open(str(next(draft.glob("*.safetensors"))), "np") as f:
        keys = sorted({k.split(".")[0] for k in f.keys()})
        d2t = f.get_tensor("d2t")
    out: dict[str, list[str]] = {}
    for c in cmds:
        r = run_in_bash(c.replace("<new dir>", "OUT"), tmp_path)
        assert r.returncode == 0, (c, r.stderr)
        out.setdefault(" ".join(c.split(" ")[:2]), []).append(r.stdout)
    assert out["specwatch diagnose"] == ["\0".join(["diagnose", "--draft", str(draft), "--target", str(target),
                                                    "--algorithm", "EAGLE3"]) + "\0"]
    assert out["specwatch fix-checkpoint"] == [
        "\0".join(["fix-checkpoint", "--draft", str(draft), "--out", "OUT"]) + "\0", "fix-checkpoint\0",
        "\0".join(["fix-checkpoint", "--draft", str(draft), "--out", f"{draft}-sglang"]) + "\0"]
    keys_out, d2t_out = out["python -c"]
    assert keys_out.strip() == str(keys) and "layers" in keys
    assert d2t_out.split()[-2:] == [str(d2t.min()), str(d2t.max())]
    assert not list(tmp_path.glob("pwned*"))  # no command substitution ran

    # A Hugging Face repo id: its snapshot, fetched in the command, quoted as well.
    hub = known_causes({"speculative_draft_model_path": "org/dr`aft $(touch pwned)"})
    r = run_in_bash(commands(hub)[0].replace("<target dir>", "T"), tmp_path)  # a placeholder to fill in
    assert r.stdout.split("\0")[:3] == ["diagnose", "--draft", f"{tmp_path}/hub"]
    assert not list(tmp_path.glob("pwned*"))


def test_a_restart_command_line_is_pasted_back_as_it_was(tmp_path):
    argv = ["python", "-m", "sglang.launch_server", "--model-path", "/m/a b;$(touch pwned)", "--port", "30000"]
    [(is_code, text)] = split_code(_cmd(SimpleNamespace(cmdline=tuple(argv))))  # reads only cmdline
    r = run_in_bash(text.replace("python -m", "specwatch", 1), tmp_path)
    assert r.stdout.split("\0")[:-1] == ["sglang.launch_server", "--model-path", "/m/a b;$(touch pwned)",
                                          "--port", "30000"]
    assert not list(tmp_path.glob("pwned*"))


def _mrkdwn_texts(payload: dict) -> list[str]:
    texts = [payload["text"]]
    for b in payload["blocks"]:
        if b.get("text", {}).get("type") == "mrkdwn":
            texts.append(b["text"]["text"])
        texts += [f["text"] for f in b.get("fields", [])]
        texts += [e["text"] for e in b.get("elements", []) if e.get("type") == "mrkdwn"]
    return texts


def _check_slack_text(text: str) -> list[str]:
    """What Slack would make of `text`: no raw `<`/`>`, every `&` an entity, code spans (single
    backticks, Slack has no longer fence) balanced, and no formatting pair of a hostile value
    outside them. Returns the code spans' contents."""
    assert "<" not in text and ">" not in text, text
    assert not re.search(r"&(?!amp;|lt;|gt;)", text), text
    parts = text.split("`")
    assert len(parts) % 2 == 1, f"unbalanced code span: {text}"
    for prose in parts[0::2]:
        for mark in FORMATTING:
            assert mark not in prose, (mark, text)
    return parts[1::2]


@pytest.mark.parametrize("grouped", [False, True])
def test_every_field_reaches_slack_escaped(grouped):
    """Labels, summary, description, evidence names and values, fixes and the update note,
    each carrying the hostile value: every Slack text passes `_check_slack_text`, and the
    commands in "What to check" are the shell-quoted ones, readable in their code spans."""
    path = "/models/" + HOSTILE
    fixes = known_causes({"speculative_draft_model_path": path, "model_path": "/m/t`x`", "speculative_algorithm": "EAGLE3"})
    alert = Alert(
        labels={"alertname": "AcceptanceCollapse", "severity": "critical *x*", "server": "box " + HOSTILE,
                "rank": "TP0 " + HOSTILE},
        annotations={"summary": f"collapsed on {HOSTILE}: value {code(path)}",
                     "description": f"text {HOSTILE} and {code(path)}", "update": f"note {HOSTILE} {code(path)}"},
        starts_at=1_700_000_000.0,
        evidence=[("speculative_draft_model_path", path), (HOSTILE, "1.00")],
        fixes=fixes,
    )
    other = Alert(labels={"alertname": "ThroughputDrop", "server": "box", "rank": "TP1"},
                  annotations={"summary": "s"}, starts_at=1_700_000_000.0)
    payload = (build_notification_payload(Notification("slack", "g", {}, [alert, other])) if grouped
               else build_payload(alert))
    spans = [s for t in _mrkdwn_texts(payload) for s in _check_slack_text(t)]
    shown = "/models/my draft;$(touch pwned) ˋtouch pwned2ˋ *b* _i_ ~s~ 'q' \"d\" &lt;!channel&gt; &amp;amp;"
    assert shown in spans  # a value in a code span: as typed, but for the backtick look-alike
    assert all("&amp;amp;" in t for t in _mrkdwn_texts(payload) if "touch pwned" in t)  # `&amp;` shown as typed
    quoted = shlex.quote(path).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("`", "ˋ")
    assert f"specwatch diagnose --draft {quoted} --target '/m/tˋxˋ' --algorithm EAGLE3" in spans
    assert len([s for s in spans if s.startswith("python -c")]) == 2
    assert "<" not in json.dumps(payload, ensure_ascii=False)


def test_the_hostile_sample_reaches_slack_as_data(tmp_path, slack):
    """The team's evidence (shell-in-draft-path.log) through a real daemon to a local Slack:
    the diagnose command in "What to check" is quoted, and pasted into bash it runs nothing."""
    log = tmp_path / "sglang.log"
    shutil.copy(DATA / "hostile" / "shell-in-draft-path.log", log)
    d = SpecwatchDaemon(tmp_path, log, env={"SW_TEST_HOOK": slack.url}, alerts={
        "group_wait": "0s", "slack": {"webhook_url_env": "SW_TEST_HOOK"}})
    d.start()
    # the first message fires the collapse; the diagnosis's outcome may follow as its one update
    msg = wait_for(lambda: slack.received, timeout=20, what="the collapse message")[0]
    assert d.stop()[0] == 0
    [check] = [b["text"]["text"] for b in msg["blocks"] if b.get("text", {}).get("text", "").startswith("*What to check*")]
    spans = _check_slack_text(check)
    diagnose = [s for s in spans if s.startswith("specwatch diagnose")]
    assert diagnose == ["specwatch diagnose --draft '/models/my draft;$(touch /tmp/pwned)' --target /models/tgt "
                        "--algorithm EAGLE3"]
    r = run_in_bash(diagnose[0].replace("/tmp/pwned", str(tmp_path / "pwned")), tmp_path)
    assert r.stdout.split("\0")[:3] == ["diagnose", "--draft", f"/models/my draft;$(touch {tmp_path}/pwned)"]
    assert not (tmp_path / "pwned").exists()


def test_mtp_and_standalone_checks_run_with_the_path_as_one_argument(tmp_path):
    """The checks the collapse suggests for a NEXTN head and a STANDALONE draft, pasted into bash
    with folders whose names are shell syntax, read the real files (issue #10 item 4)."""
    import numpy as np
    from safetensors.numpy import save_file

    target = tmp_path / HOSTILE.replace("/", "")
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    w = np.zeros((2, 2), dtype=np.float32)
    save_file({"model.layers.0.mlp.weight": w, "model.layers.2.eh_proj.weight": w, "model.layers.2.enorm.weight": w,
               "mtp.fc.weight": w}, str(target / "model.safetensors"))
    [head] = commands(known_causes({"speculative_algorithm": "NEXTN", "model_path": str(target)}))
    r = run_in_bash(head, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["mtp.*:", "1", "layers.2.*:", "2"]

    draft = tmp_path / ("draft " + HOSTILE.replace("/", ""))
    draft.mkdir()
    vocab = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2}}}
    (target / "tokenizer.json").write_text(json.dumps(vocab))
    (draft / "tokenizer.json").write_text(json.dumps(vocab))
    args = {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": str(draft), "model_path": str(target)}
    check, launch = commands(known_causes(args))
    assert shlex.split(launch) == ["python", "-m", "sglang.launch_server", "--model-path", str(draft)]
    assert run_in_bash(check, tmp_path).stdout.split() == ["3", "3", "same"]
    vocab["model"]["vocab"]["d"] = 3
    (draft / "tokenizer.json").write_text(json.dumps(vocab))
    assert run_in_bash(check, tmp_path).stdout.split() == ["4", "3", "DIFFERENT"]
    assert not list(tmp_path.glob("pwned*"))
