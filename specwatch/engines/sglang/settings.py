"""A running SGLang server's settings, as a `server_args`-style dict (field name → value).

Three sources: the startup `server_args=ServerArgs(...)` log line, `/server_info` (read by
`server_api.ServerApiSource`, the one fetcher), and the launch command line, read here by the
one parser every part of specwatch uses (the process source, `diagnose --pid`).

SGLang parses its command line with argparse and `allow_abbrev` left on
(`sglang/srt/server_args.py` `prepare_server_args`, 0.4.6-0.5.23), so a flag may be written as
any prefix of a long option that no other option of that version starts with
(`--speculative-algo`, `--tp`). `FLAGS` holds, for each option specwatch reads, the shortest
such prefix among the options of SGLang 0.5.23 (`server_args.py` and
`srt/arg_groups/fields/*.py`); tests/sources/test_server_settings.py checks every prefix
against a real argparse built from those sources (and from 0.5.11, which never reads one
differently). A shorter prefix an older SGLang accepted (`--speculative-draft` in 0.4.x) is not
read: the server's `server_args` log line and `/server_info` still give that value.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

from specwatch.engines.vllm import settings as vllm_settings
from specwatch.sources.cmdline import python_program

_INT, _STR, _UPPER, _TRUE = int, str, str.upper, None
Converter = Callable[[str], object] | None  # a flag's value → the field's; None (_TRUE): store-true

# option → (ServerArgs field, converter, shortest unique prefix in SGLang 0.5.23)
FLAGS: dict[str, tuple[str, Converter, str]] = {
    "--model-path": ("model_path", _STR, "--model-p"),
    "--model": ("model_path", _STR, "--model"),
    "--served-model-name": ("served_model_name", _STR, "--se"),
    "--speculative-algorithm": ("speculative_algorithm", _UPPER, "--speculative-al"),
    "--speculative-draft-model-path": ("speculative_draft_model_path", _STR, "--speculative-draft-model-p"),
    "--speculative-draft-model": ("speculative_draft_model_path", _STR, "--speculative-draft-model"),
    "--speculative-draft-model-revision": ("speculative_draft_model_revision", _STR, "--speculative-draft-model-r"),
    "--speculative-num-steps": ("speculative_num_steps", _INT, "--speculative-num-s"),
    "--speculative-eagle-topk": ("speculative_eagle_topk", _INT, "--speculative-ea"),
    "--speculative-num-draft-tokens": ("speculative_num_draft_tokens", _INT, "--speculative-num-d"),
    "--speculative-draft-window-size": ("speculative_draft_window_size", _INT, "--speculative-draft-w"),
    "--context-length": ("context_length", _INT, "--context-l"),
    "--tp-size": ("tp_size", _INT, "--tp"),
    "--tensor-parallel-size": ("tp_size", _INT, "--te"),
    "--dp-size": ("dp_size", _INT, "--dp"),
    "--data-parallel-size": ("dp_size", _INT, "--da"),
    "--pp-size": ("pp_size", _INT, "--pp-s"),
    "--pipeline-parallel-size": ("pp_size", _INT, "--pi"),
    "--ep-size": ("ep_size", _INT, "--ep-s"),
    "--ep": ("ep_size", _INT, "--ep"),
    "--expert-parallel-size": ("ep_size", _INT, "--expert-p"),
    "--port": ("port", _INT, "--po"),
    "--host": ("host", _STR, "--ho"),
    "--log-level": ("log_level", _STR, "--log-level"),
    "--decode-log-interval": ("decode_log_interval", _INT, "--decode-l"),
    "--enable-metrics": ("enable_metrics", _TRUE, "--enable-metrics"),
    "--disaggregation-mode": ("disaggregation_mode", _STR, "--disaggregation-m"),
}


def launcher_args(argv: list[str] | tuple[str, ...]) -> list[str] | None:
    """The server arguments of an SGLang launcher command line, or None if it is not one.

    Recognised: `<python> [options] -m sglang.launch_server ARGS`, `<python> [options]
    .../sglang/launch_server.py ARGS`, `<python> .../bin/sglang serve ARGS` (a console script run
    through its shebang), `sglang serve ARGS` and `<python> -m sglang serve ARGS` (0.5.x CLI).
    Only the program and the interpreter's own options are looked at, so `tail -f
    sglang.launch_server.log`, an editor, or `bash -c "..."` never match.
    """
    if not argv:
        return None
    if PurePosixPath(argv[0]).name == "sglang":
        return list(argv[2:]) if list(argv[1:2]) == ["serve"] else None
    target = python_program(argv)
    if target is None:
        return None
    kind, name, rest = target
    if kind == "module":
        if name == "sglang.launch_server":
            return rest
        return rest[1:] if name == "sglang" and rest[:1] == ["serve"] else None
    path = PurePosixPath(name)
    if path.name == "launch_server.py" and path.parent.name == "sglang":
        return rest
    return rest[1:] if path.name == "sglang" and rest[:1] == ["serve"] else None


def resolve_flag(name: str) -> tuple[str, Converter] | None:
    """(ServerArgs field, value converter) of a long option or its abbreviation, by argparse's
    rule over SGLang 0.5.23's options; None for an option specwatch does not read or an
    ambiguous prefix."""
    hit = FLAGS.get(name)
    if hit is not None:
        return hit[:2]
    hits = {v[:2] for opt, v in FLAGS.items() if opt.startswith(name) and name.startswith(v[2])}
    return hits.pop() if len(hits) == 1 else None


def parse_server_argv(args: list[str] | tuple[str, ...]) -> dict[str, object]:
    """SGLang server flags → ServerArgs field values (see the module docstring).

    Handles `--flag value`, `--flag=value`, abbreviations, aliases (`--model`, `--tp`,
    `--speculative-draft-model`), store-true flags and repeats (the last one wins, as in
    argparse). `speculative_algorithm` is upper-cased (SGLang does too); `NEXTN` is kept as typed
    (SGLang resolves it to EAGLE later). Flags specwatch does not read are skipped; a value that
    does not convert is kept as text; a flag without its value is skipped.
    """
    out: dict[str, object] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("--"):
            continue
        name, eq, value = tok.partition("=")
        flag = resolve_flag(name)
        if flag is None:
            continue
        field, conv = flag
        if conv is _TRUE:
            out[field] = True
            continue
        if not eq:
            if i >= len(args) or args[i].startswith("--"):
                continue  # no value: argparse would have refused it
            value = args[i]
            i += 1
        try:
            out[field] = conv(value)
        except ValueError:
            out[field] = value
    return out


def from_cmdline(argv: list[str] | tuple[str, ...]) -> dict[str, object]:
    """Server args from a launch command line (`python -m sglang.launch_server ...`, `sglang
    serve ...`), or from the server flags alone."""
    args = launcher_args(argv)
    if args is None:
        vargs = vllm_settings.launcher_args(argv)
        if vargs is not None:
            return vllm_settings.parse_argv(vargs)
    return parse_server_argv(argv if args is None else args)


def from_pid(pid: int) -> dict[str, object]:
    """Server args from a running process's command line. Raises psutil.Error."""
    import psutil

    return from_cmdline(psutil.Process(pid).cmdline())


def from_log(path: str | Path) -> dict[str, object]:
    """The last `server_args` line of an SGLang log ({} when none). Raises OSError."""
    from specwatch.core.events import ServerArgs
    from specwatch.engines.sglang.log import parse_line

    args: dict[str, object] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if "server_args=" in line:
                ev = parse_line(line.rstrip("\n"))
                if isinstance(ev, ServerArgs):
                    args = ev.args
    return args


def from_server_info(url: str, timeout: float = 5.0, api_key: str | None = None) -> dict[str, object]:
    """The server args of `<url>/server_info` (`/get_server_info` on servers before 0.5.6), read
    as the daemon reads them (`server_api.ServerApiSource.server_info`). Raises
    server_api.ApiError (an OSError) when the server does not answer with them."""
    from specwatch.sources.server_api import ServerApiSource

    src = ServerApiSource(url, lambda *_: None, server=url, api_key=api_key, timeout=timeout)
    return dict(src.server_info().args)
