"""A running SGLang server's settings, as a `server_args`-style dict (field name → value).

Three sources (sglang.md §3.1, §7): the startup `server_args=ServerArgs(...)` log line, the
`/server_info` JSON (a flat object of every server arg, 0.4.9+; `/get_server_info` before
0.5.6), and the process command line (`--speculative-algorithm EAGLE3 ...`; field name = flag
without `--`, `-` → `_`; argparse prefixes such as `--speculative-algo` are accepted).
"""

from __future__ import annotations

from pathlib import Path

# Flags whose values specwatch uses, with SGLang's aliases (server_args.py@0.5.23).
FLAGS = {
    "--model-path": "model_path", "--model": "model_path",
    "--speculative-algorithm": "speculative_algorithm",
    "--speculative-draft-model-path": "speculative_draft_model_path",
    "--speculative-draft-model": "speculative_draft_model_path",
    "--speculative-num-steps": "speculative_num_steps",
    "--speculative-eagle-topk": "speculative_eagle_topk",
    "--speculative-num-draft-tokens": "speculative_num_draft_tokens",
    "--speculative-draft-window-size": "speculative_draft_window_size",
    "--context-length": "context_length",
}


def from_log(path: str | Path) -> dict[str, object]:
    """The last `server_args` line of an SGLang log ({} when none). Raises OSError."""
    from specwatch.events import ServerArgs
    from specwatch.sources.sglang_log import parse_line

    args: dict[str, object] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if "server_args=" in line:
                ev = parse_line(line.rstrip("\n"))
                if isinstance(ev, ServerArgs):
                    args = ev.args
    return args


def from_server_info(url: str, timeout: float = 5.0, api_key: str | None = None) -> dict[str, object]:
    """GET `<url>/server_info` (falling back to `/get_server_info`). Raises requests' errors."""
    import requests

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = url.rstrip("/")
    for path in ("/server_info", "/get_server_info"):
        r = requests.get(base + path, timeout=timeout, headers=headers)
        if r.status_code == 404:
            continue
        r.raise_for_status()
        doc = r.json()
        return doc if isinstance(doc, dict) else {}
    return {}


def from_cmdline(argv: list[str]) -> dict[str, object]:
    """Server args from a launch command line (`python -m sglang.launch_server ...`)."""
    args: dict[str, object] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        flag, eq, value = tok.partition("=")
        if flag.startswith("--"):
            names = [f for f in FLAGS if f == flag] or [f for f in FLAGS if f.startswith(flag) and len(flag) > 6]
            if len({FLAGS[n] for n in names}) == 1:
                if not eq and i + 1 < len(argv):
                    value, i = argv[i + 1], i + 1
                args[FLAGS[names[0]]] = int(value) if value.lstrip("-").isdigit() else value
        i += 1
    if isinstance(args.get("speculative_algorithm"), str):
        args["speculative_algorithm"] = args["speculative_algorithm"].upper()
    return args


def from_pid(pid: int) -> dict[str, object]:
    """Server args from a running process's command line. Raises psutil.Error."""
    import psutil

    return from_cmdline(psutil.Process(pid).cmdline())
