"""A vLLM server's launch command line → its settings, under the names the rules read.

Launchers (console script `vllm = vllm.entrypoints.cli.main:main` from 0.7.3, `vllm.scripts:main`
in 0.5.5-0.6.x; `entry_points.txt` of the wheels): `vllm serve MODEL …`, `<python> …/bin/vllm
serve MODEL …`, `<python> -m vllm.entrypoints.cli.main serve MODEL …` and `<python> -m
vllm.entrypoints.openai.api_server --model MODEL …` (the model may also be `--model`).

Flags (`EngineArgs.add_cli_args`, `vllm/engine/arg_utils.py`, and the server's
`vllm/entrypoints/openai/cli_args.py`, 0.8.5.post1 and 0.33.0): `--speculative-config '<JSON>'`
(0.8.3+; `--speculative_config`, `-sc` from 0.19.1, dotted `--speculative-config.method eagle3`
keys), the V0 flags `--speculative-model` / `--num-speculative-tokens` (up to 0.8.2),
`--spec-method` / `--spec-model` / `--spec-tokens` (0.22.1+), `--tensor-parallel-size` / `-tp`,
`--pipeline-parallel-size` / `-pp`, `--data-parallel-size` / `-dp`, `--port` (default 8000),
`--host`, `--served-model-name`, `--disable-log-stats`. vLLM's parser accepts `_` for `-` and
`--x=y`.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath

from specwatch.sources.cmdline import python_program
from specwatch.engines.vllm.log import ENGINE, spec_settings

DEFAULT_PORT = 8000  # `--port` default of vllm/entrypoints/openai/cli_args.py (0.4-0.33)

_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")

# flag (after `_` → `-`) → (key, converter)
_FLAGS = {
    "--model": ("model", str), "--port": ("port", int), "--host": ("host", str),
    "--served-model-name": ("served_model_name", str),
    "--tensor-parallel-size": ("tp_size", int), "-tp": ("tp_size", int),
    "--pipeline-parallel-size": ("pp_size", int), "-pp": ("pp_size", int),
    "--data-parallel-size": ("dp_size", int), "-dp": ("dp_size", int),
    "--speculative-config": ("speculative_config", str), "-sc": ("speculative_config", str),
    "--speculative-model": ("spec.model", str), "--num-speculative-tokens": ("spec.num_speculative_tokens", int),
    "--spec-model": ("spec.model", str), "--spec-method": ("spec.method", str),
    "--spec-tokens": ("spec.num_speculative_tokens", int),
}
_STORE_TRUE = {"--disable-log-stats": "disable_log_stats"}


class VllmArgv(list):
    """The server arguments of a vLLM launcher (a list: the process source keeps it as argv)."""


def launcher_args(argv: list[str] | tuple[str, ...]) -> VllmArgv | None:
    """The arguments after the launcher (`MODEL --flag …` for `vllm serve`), None when `argv` is
    not a vLLM server launch. Only the program and the interpreter's options are looked at."""
    if not argv:
        return None
    if PurePosixPath(argv[0]).name == "vllm":
        return VllmArgv(argv[2:]) if list(argv[1:2]) == ["serve"] else None
    target = python_program(argv)
    if target is None:
        return None
    kind, name, rest = target
    if kind == "module" and name in _MODULES:
        return VllmArgv(rest)
    serve = (kind == "module" and name == "vllm.entrypoints.cli.main") or (kind == "script" and PurePosixPath(name).name == "vllm")
    return VllmArgv(rest[1:]) if serve and rest[:1] == ["serve"] else None


def parse_argv(args: list[str] | tuple[str, ...]) -> dict[str, object]:
    """vLLM server arguments → settings: `engine` "vllm", `model_path`, `port` (8000 when not
    given), `tp_size`, `pp_size`, `dp_size`, `host`, `served_model_name`, `disable_log_stats`,
    `speculative_config` (the parsed JSON, or the text when it does not parse) and the
    speculative settings of `vllm_log.spec_settings`. The last of a repeated flag wins."""
    out: dict[str, object] = {"engine": ENGINE}
    spec: dict[str, object] = {}
    model = None
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("-"):
            if model is None and i == 1:
                model = tok  # `vllm serve MODEL`
            continue
        name, eq, value = tok.partition("=")
        name = name[:2] + name[2:].replace("_", "-") if name.startswith("--") else name
        if name in _STORE_TRUE:
            out[_STORE_TRUE[name]] = True
            continue
        dotted = name.startswith("--speculative-config.")
        if name not in _FLAGS and not dotted:
            continue
        if not eq:
            if i >= len(args) or args[i].startswith("-"):
                continue
            value = args[i]
            i += 1
        if dotted:
            spec[name[len("--speculative-config."):].replace("-", "_")] = _scalar(value)
            continue
        key, conv = _FLAGS[name]
        try:
            v = conv(value)
        except ValueError:
            v = value
        if key == "model":
            model = v
        elif key == "speculative_config":
            try:
                doc = json.loads(value)
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                spec.update(doc)
            else:
                out["speculative_config"] = value
        elif key.startswith("spec."):
            spec[key[5:]] = v
        else:
            out[key] = v
    if model is not None:
        out["model_path"] = model
    out.setdefault("port", DEFAULT_PORT)
    if spec:
        out["speculative_config"] = spec
        k = spec.get("num_speculative_tokens")
        out.update(spec_settings(spec.get("method"), spec.get("model"), k if isinstance(k, int) else None))
    return out


def _scalar(value: str) -> object:
    try:
        return json.loads(value)
    except ValueError:
        return value
