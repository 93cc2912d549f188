"""Server settings: the one command-line parser, checked against a real argparse built from
real SGLang sources, and /server_info read through the daemon's own fetcher."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from sglang_options import argparse_reading  # noqa: E402

from specwatch.probes.base import ServerSettings  # noqa: E402
from specwatch.sources.server_api import ApiError  # noqa: E402
from specwatch.engines.sglang.settings import (  # noqa: E402
    FLAGS,
    from_cmdline,
    from_server_info,
    parse_server_argv,
    resolve_flag,
)

MODEL = "/models/meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "/models/lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B"


@pytest.mark.parametrize("version", ["0.5.23", "0.5.11"])
def test_every_abbreviation_reads_as_sglang_argparse_does(version, sglang_roots):
    """Every prefix of every option specwatch reads, against argparse with all of that SGLang's
    options: 0.5.23 reads each one as specwatch does; 0.5.11 never reads one differently."""
    read = argparse_reading(sglang_roots[version])
    checked = read_as_ours = 0
    for option in FLAGS:
        for end in range(3, len(option) + 1):
            prefix = option[:end]
            theirs = read(prefix)  # the argument's first option string, or None (refused)
            theirs_field = FLAGS[theirs][0] if theirs in FLAGS else None
            ours = resolve_flag(prefix)
            ours_field = ours[0] if ours else None
            checked += 1
            read_as_ours += ours_field is not None
            if version == "0.5.23":
                assert ours_field == theirs_field, prefix
            elif ours_field is not None and theirs is not None:
                assert ours_field == theirs_field, prefix
    assert checked > 400 and read_as_ours > 150


def test_forms_abbreviations_aliases_repeats():
    args = parse_server_argv([
        "--model", MODEL, "--speculative-algo", "eagle3", "--speculative-draft-model-p", DRAFT,
        "--speculative-num-steps=3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
        "--tp", "8", "--dp-size=2", "--pipeline-parallel-size", "1", "--port", "30001", "--log-level", "warning",
        "--decode-log-interval", "10", "--enable-metrics", "--trust-remote-code", "--mem-fraction-static", "0.85",
        "--log-level-http", "info", "--speculative-token-map", "/x/map.pt", "--context-length", "131072",
        "--speculative-num-steps", "5",
    ])
    assert args == {
        "model_path": MODEL, "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": DRAFT,
        "speculative_num_steps": 5, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4,
        "tp_size": 8, "dp_size": 2, "pp_size": 1, "port": 30001, "log_level": "warning",
        "decode_log_interval": 10, "enable_metrics": True, "context_length": 131072,
    }
    # a flag without its value is skipped, a value that does not convert is kept as text
    assert parse_server_argv(["--speculative-algorithm", "--port", "x1"]) == {"port": "x1"}


def test_ambiguous_prefixes_are_not_read():
    # --speculative-draft: draft-model-path, -model-revision, -load-format, -window-size, ... in
    # 0.5.23 (argparse refuses it); --log-l: --log-level and --log-level-http; --ep-: --ep-size
    # and --ep-dispatch-algorithm
    for flag in ("--speculative-draft", "--log-l", "--ep-", "--spec", "--model-"):
        assert resolve_flag(flag) is None, flag
    assert "speculative_draft_model_path" not in parse_server_argv(["--speculative-draft", DRAFT])


def test_command_line_of_a_launcher_for_diagnose_and_the_process_source():
    argv = ["python3", "-m", "sglang.launch_server", "--model", "/m/Kimi-K2.5", "--speculative-algo", "nextn",
            "--speculative-draft-model", "/m/k25-eagle3", "--speculative-num-steps=5", "--speculative-eagle-topk", "1",
            "--tp", "8", "--context-length", "131072"]
    args = from_cmdline(argv)
    assert args == {"model_path": "/m/Kimi-K2.5", "speculative_algorithm": "NEXTN",
                    "speculative_draft_model_path": "/m/k25-eagle3", "speculative_num_steps": 5,
                    "speculative_eagle_topk": 1, "tp_size": 8, "context_length": 131072}
    s = ServerSettings.from_server_args(args)
    assert s.algorithm == "EAGLE" and s.num_steps == 5 and s.context_length == 131072  # NEXTN resolves to EAGLE
    # `sglang serve` reads the same; the program's own words are not flags
    assert from_cmdline(["sglang", "serve", "--tp", "8", "--port", "31000"]) == {"tp_size": 8, "port": 31000}


def _serve(handler_paths: dict[str, dict]):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = handler_paths.get(self.path)
            code, data = (200, json.dumps(body).encode()) if body is not None else (404, b"{}")
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_server_info_endpoint_with_fallback_path():
    body = {"model_path": "/m/t", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
            "context_length": 8192, "mem_fraction_static": 0.8, "version": "0.5.4"}
    srv = _serve({"/get_server_info": body})  # an old server: only /get_server_info
    try:
        args = from_server_info(f"http://127.0.0.1:{srv.server_address[1]}")
    finally:
        srv.shutdown()
    # the daemon's reading: the settings specwatch uses, not the version or every other arg
    assert args == {"model_path": "/m/t", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3,
                    "context_length": 8192}
    assert ServerSettings.from_server_args(args).algorithm == "EAGLE3"


def test_server_info_that_does_not_answer_is_an_os_error():
    srv = _serve({})
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        with pytest.raises(ApiError, match="/get_server_info: http_404") as e:
            from_server_info(url)
    finally:
        srv.shutdown()
    assert isinstance(e.value, OSError)  # what `diagnose` reports as a clean error
