"""specwatch's own words reach Slack as typed: every sentence in the rules and probes (fixes,
titles, summaries, evidence), rendered as the Slack notifier renders it, holds no look-alike
character. Outside a code span an underscore or asterisk that could format is swapped for U+FF3F /
U+2217, and a paste of `specwatch_gpu＿∗` into PromQL then matches nothing: such names belong in
code spans."""

from __future__ import annotations

import ast

from checkpoints import ROOT
from specwatch.notifiers.slack import _LOOKALIKE, mrkdwn

LOOKALIKES = set(_LOOKALIKE.values())


def _skipped(tree: ast.AST) -> set[int]:
    """Docstrings, the insides of code() calls (shown as code spans) and the `_PY*` command
    fragments (used only inside code spans): not prose."""
    out: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body \
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant):
            out.add(id(n.body[0].value))
        inner = None
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "code":
            inner = n
        elif isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id.startswith("_PY") for t in n.targets):
            inner = n.value
        if inner is not None:
            out |= {id(c) for c in ast.walk(inner)}
        if isinstance(n, ast.JoinedStr):
            out |= {id(v) for v in n.values}  # read whole, below
    return out


def prose():
    """(file:line, text) for every string with a space where alert text is written: the rules, the
    probes (findings become fixes), the diagnosis notes and the failing-receiver alert."""
    sw = ROOT / "specwatch"
    for path in sorted([*(sw / "rules").glob("*.py"), *(sw / "probes").glob("*.py"), sw / "diagnosis.py",
                        sw / "notifiers" / "failing.py"]):
        tree = ast.parse(path.read_text())
        skip = _skipped(tree)
        for n in ast.walk(tree):
            if id(n) in skip:
                continue
            if isinstance(n, ast.Constant) and isinstance(n.value, str):
                text = n.value
            elif isinstance(n, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in n.values)
            else:
                continue
            if " " in text:
                yield f"{path.relative_to(ROOT)}:{n.lineno}", text


def test_advice_renders_without_lookalikes():
    seen = list(prose())
    assert len(seen) > 500 and any("Compare how each rank built its drafter" in t for _, t in seen)
    bad = [(where, text) for where, text in seen if LOOKALIKES & set(mrkdwn(text))]
    assert bad == [], "\n".join(f"{w}: {t!r}" for w, t in bad)


SAMPLES = ROOT / "tests" / "data" / "samples"


def _texts(block) -> list[str]:
    """Every mrkdwn/plain text of a Block Kit block."""
    out = []
    if isinstance(block, dict):
        if isinstance(block.get("text"), str):
            out.append(block["text"])
        for v in block.values():
            if isinstance(v, (dict, list)):
                out += _texts(v)
    elif isinstance(block, list):
        for v in block:
            out += _texts(v)
    return out


def test_slack_messages_of_the_bug_report_logs_hold_no_lookalike_and_their_banners_say_what_fired():
    """Every Slack message `replay --slack-dry-run` makes of the bug-report logs (tracebacks with
    `__init__`, paths, `*.safetensors`): no look-alike character anywhere in it, so what a reader
    copies out (a path, a log line, a command) is what was written; and the banner (`text`, what a
    phone shows) of a firing message names the alert, where, and what it says (a value or its
    summary), never a word of a resolve."""
    import json
    import subprocess
    import sys

    logs = sorted((SAMPLES / "bugreport-logs").glob("*.log")) + [SAMPLES / "kimi-k25-eagle3-collapse.log"]
    banners = []
    for log in logs:
        r = subprocess.run([sys.executable, "-m", "specwatch", "replay", "--json", "--slack-dry-run", str(log)],
                           capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        for p in json.loads(r.stdout)["slack_payloads"]:
            bad = [t for t in [p["text"], *_texts(p["blocks"])] if LOOKALIKES & set(t)]
            assert bad == [], f"{log.name}: {bad}"
            banners.append((log.stem, p["text"]))
    firing = [(s, t) for s, t in banners if not t.startswith("[RESOLVED")]
    assert len(firing) >= 15
    for server, text in firing:
        assert f" on {server}" in text and ": " in text, text
        assert "resolved" not in text.lower() and "recovered" not in text.lower(), text
    assert ("BR-28", "[FIRING] AcceptanceCollapse on BR-28 TP0: accept len 1.00 (was 3.25)") in banners
    assert ("BR-47", "[UPDATE] ServerLogError on BR-47: crash loop: 3 failed starts with the same settings") in banners
    assert ("BR-45", "[FIRING] ServerLogError on BR-45: hung scheduler (watchdog timeout) in the log of BR-45 "
                     "(DP0 TP0 EP0) (EAGLE + DP attention)") in banners


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def test_every_code_span_specwatch_writes_is_ascii():
    """A code span holds what a reader pastes (a command, a grep pattern, a PromQL name, a config
    key, a log message to search for): in every string of specwatch/ but docstrings, and in every
    constant handed to `code()`, it is plain ASCII, with no smart quote, look-alike, Unicode dash,
    no-break space or "…" that would break the paste into a shell, grep or PromQL."""
    from specwatch.alerts.model import split_code

    seen, bad = [], []
    for path in sorted((ROOT / "specwatch").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)  # and the pieces of f-strings: read whole, below
        docs |= {id(v) for j in ast.walk(tree) if isinstance(j, ast.JoinedStr) for v in j.values}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "code":
                parts = [c.value for c in ast.walk(n) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                parts = [p for is_code, p in split_code(n.value) if is_code]
            elif isinstance(n, ast.JoinedStr):
                text = "".join(v.value if isinstance(v, ast.Constant) else "X" for v in n.values)
                parts = [p for is_code, p in split_code(text) if is_code]
            else:
                continue
            seen += parts
            bad += [f"{path.relative_to(ROOT)}:{n.lineno}: {p!r}" for p in parts if not p.isascii()]
    assert len(seen) > 300 and "specwatch_gpu_*" in seen and "VLLM_USE_V2_MODEL_RUNNER=0" in seen
    assert bad == [], "\n".join(bad)
