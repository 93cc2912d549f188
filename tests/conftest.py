"""Shared fixtures: real local servers the tests talk to."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from alertmanager import BINARY as ALERTMANAGER_BINARY
from alertmanager import Alertmanager
from fake_sglang import Launcher, make_install
import procs
import prom
from slack_endpoint import SlackEndpoint

ROOT = Path(__file__).resolve().parents[1]
# Subprocesses (`python -m specwatch ...`) run this checkout, not an installed copy.
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

# The real parts each take most of the two cores for minutes (an engine, a booted guest, a Docker
# engine, a fleet of 20 agents): the test workers run them one after the other, on one worker.
REAL_PARTS = ("tests/engines/test_real_vllm.py", "tests/deploy/test_real_systemd.py",
              "tests/deploy/test_real_docker.py", "tests/deploy/test_fleet.py")


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (pyproject's addopts), with the REAL_PARTS files one unit of work."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RealPartsInTurn(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "the real parts" if path in REAL_PARTS else path

    return RealPartsInTurn(config, log)


@pytest.fixture(autouse=True)
def _reserved_ports():
    """Ports a test took with `procs.free_port()` stay reserved until it ends."""
    keep = len(procs._reserved)
    yield
    procs.release_ports(keep)


@pytest.fixture
def slack():
    """A Slack-compatible webhook endpoint on 127.0.0.1; `slack.url`, `slack.received`."""
    s = SlackEndpoint()
    yield s
    s.close()


@pytest.fixture
def alertmanager(tmp_path):
    """Factory: `alertmanager(receiver=None, group_by=None, port=None)` starts a real
    Alertmanager on 127.0.0.1 (see tests/alertmanager.py); all are stopped after the test."""
    if ALERTMANAGER_BINARY is None:
        pytest.skip("prometheus-alertmanager not installed (.ci/run installs it)")
    started = []

    def start(receiver=None, group_by=None, port=None):
        started.append(Alertmanager(tmp_path, receiver, group_by=group_by, port=port))
        return started[-1]

    yield start
    for am in started:
        am.close()


@pytest.fixture(scope="session")
def sglang_install(tmp_path_factory):
    """bin/python of a venv with a stand-in `sglang` 0.5.6.post2 (tests/fake_sglang.py)."""
    return make_install(tmp_path_factory.mktemp("venv") / "sglang-env", version="0.5.6.post2")


@pytest.fixture
def sglang_procs():
    """`sglang_procs.start(argv, ...)` launches a fake SGLang server; all are killed after the test."""
    runner = Launcher()
    yield runner
    runner.stop_all()


# The real SGLang sources the probes read (never imported): `.ci/run` pre-installs them with
#   python3 -m pip install --no-deps --target .cache/sglang-<version> sglang==<version>
SGLANG_VERSIONS = ("0.5.11", "0.5.23")
SGLANG_CACHE = ROOT / ".cache"


def _cached(root: Path, package: str, fill) -> Path:
    """`root` once it holds `package/_version.py`: `fill(root)` makes it if missing, one test
    worker at a time (the xdist workers share `.cache`)."""
    if (root / package / "_version.py").is_file():
        return root
    SGLANG_CACHE.mkdir(exist_ok=True)
    with open(SGLANG_CACHE / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / package / "_version.py").is_file():  # else another worker filled it meanwhile
            fill(root)
    return root


def sglang_root(version: str) -> Path:
    """`.cache/sglang-<version>`, installed from PyPI (sources only, no dependencies) if missing."""
    return _cached(SGLANG_CACHE / f"sglang-{version}", "sglang", lambda root: _install_sglang(root, version))


def _install_sglang(root: Path, version: str) -> None:
    tmp = SGLANG_CACHE / f".sglang-{version}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                        "--target", str(tmp), f"sglang=={version}"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot install the sglang=={version} sources into {root}: {r.stderr[-2000:]}")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)  # complete or absent, never half-installed


@pytest.fixture(scope="session")
def sglang_roots() -> dict[str, Path]:
    return {v: sglang_root(v) for v in SGLANG_VERSIONS}


@pytest.fixture(scope="session")
def facts(sglang_roots):
    """SourceFacts per version, shared by the session (they cache parsed files)."""
    from specwatch.engines.sglang.source import SourceFacts

    return {v: SourceFacts(root) for v, root in sglang_roots.items()}


# The real vLLM sources the vLLM probes read (never imported): `.ci/run` unpacks the Python files
# of each wheel into .cache/vllm-<version> (the wheels are 330 MB, the sources 12 and 57 MB).
VLLM_VERSIONS = ("0.8.5.post1", "0.33.0")


def vllm_root(version: str) -> Path:
    """`.cache/vllm-<version>`, unpacked from the PyPI wheel (its .py files only) if missing."""
    return _cached(SGLANG_CACHE / f"vllm-{version}", "vllm", lambda root: _unpack_vllm(root, version))


def _unpack_vllm(root: Path, version: str) -> None:
    import tempfile
    import zipfile

    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                            "-d", tmp, f"vllm=={version}"], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"cannot download the vllm=={version} wheel for {root}: {r.stderr[-2000:]}")
        partial = SGLANG_CACHE / f".vllm-{version}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(next(Path(tmp).glob("vllm-*.whl"))) as z:
            z.extractall(partial, [n for n in z.namelist() if n.endswith(".py")])
    shutil.rmtree(root, ignore_errors=True)
    partial.rename(root)


@pytest.fixture(scope="session")
def vllm_facts():
    """VllmFacts per version (tests/probes/test_vllm_probes.py)."""
    from specwatch.engines.vllm.source import VllmFacts

    return {v: VllmFacts(vllm_root(v)) for v in VLLM_VERSIONS}


@pytest.fixture
def prometheus(tmp_path):
    """Start real Prometheus servers: `prometheus(scrape_configs, rule_files=())` → prom.Prometheus
    (see tests/prom.py); all are stopped after the test."""
    if not prom.available():
        pytest.skip(f"{prom.PROMETHEUS} not installed (Debian package prometheus; .ci/run installs it)")
    started = []

    def start(scrape_configs, rule_files=(), name="prometheus"):
        p = prom.Prometheus(tmp_path / name, scrape_configs, rule_files)
        started.append(p)
        return p.start()

    yield start
    for p in started:
        p.stop()
