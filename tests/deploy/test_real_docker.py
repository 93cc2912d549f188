"""specwatch following the logs of real Docker containers (dockerd 20.10, json-file:
tests/docker_engine.py) with the README's config (`path: .../containers/*/*-json.log`,
`server: "{container}"`): the engine's own log files through `docker restart`, a container
re-created under the same name and json-file's own rotation (`max-size`, `max-file`), every
line counted exactly once. One engine serves the module.

Without root, dockerd (Debian package docker.io) or busybox (busybox-static) the tests skip
with that line; in CI (`CI=true`, .ci/run installs them) they fail instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

import docker_engine
from procs import decode_line, free_port, scrape, wait_for
from specwatch_daemon import SpecwatchDaemon

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(900)

# The container's program: print the lines the test put in /in/<name>, paced, then wait.
RUN = """while read -r line; do echo "$line"; sleep 0.05; done < /in/$1
exec sleep 3600
"""


def need_engine() -> None:
    why = docker_engine.missing()
    if why is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"real Docker: {why}")
    pytest.skip(f"real Docker: {why}")


@pytest.fixture(scope="module")
def engine():
    need_engine()
    e = docker_engine.Engine()
    try:
        e.busybox_image()
        yield e
    finally:
        e.close()


def lines(n: int, accept: float, minute: int) -> str:
    return "".join(decode_line(accept, f"16:{minute:02d}:{s:02d}") for s in range(n))


def decode_count(d: SpecwatchDaemon, server: str) -> float | None:
    return scrape(d.port).get(("specwatch_log_lines_total", (("kind", "decode"), ("server", server))))


def accept_length(d: SpecwatchDaemon, server: str) -> float | None:
    found = [v for (n, ls), v in scrape(d.port).items()
             if n == "specwatch_accept_length" and ("server", server) in ls]
    return found[0] if len(found) == 1 else None


def run_container(engine, name: str, inbox: Path, batch: str, *log_opts: str) -> str:
    return engine.out("run", "-d", "--name", name, "--network", "none", "-v", f"{inbox}:/in:ro",
                      *(f"--log-opt={o}" for o in log_opts), "local/busybox:1", "sh", "/in/run.sh", batch)


def wait_count(d: SpecwatchDaemon, server: str, want: float, what: str) -> None:
    try:
        wait_for(lambda: decode_count(d, server) == want, timeout=30, interval=0.2, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}: {decode_count(d, server)} decode lines of {server}, want {want}\n"
                             f"{d.output[-3000:]}") from None


@pytest.fixture
def daemon(tmp_path, engine):
    d = SpecwatchDaemon(tmp_path, tmp_path / "unused.log", extra={
        "logs": [{"path": f"{engine.data}/containers/*/*-json.log", "server": "{container}"}],
        "follow": {"poll_interval": "0.2s", "rescan_interval": "0.5s"}})
    d.start()
    yield d
    d.stop()


def test_a_container_followed_through_restart_and_recreation(tmp_path, engine, daemon):
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "run.sh").write_text(RUN)
    (inbox / "first").write_text(lines(3, 3.10, 1))
    cid = run_container(engine, "sglang-a", inbox, "first")
    wait_count(daemon, "sglang-a", 3, "the container's 3 lines")
    assert accept_length(daemon, "sglang-a") == 3.10

    # docker restart: the same container, its log file appended to (its earlier lines stay there)
    (inbox / "first").write_text(lines(4, 2.90, 2))
    engine.docker("restart", "-t", "0", "sglang-a")
    wait_count(daemon, "sglang-a", 7, "3 + 4 lines after docker restart")
    assert accept_length(daemon, "sglang-a") == 2.90
    log = engine.log_path("sglang-a")
    assert log.parent.name == cid and log.read_text().count("Decode batch") == 7

    # re-created under the same name: a new id, a new file; the old one is deleted with its folder
    engine.docker("rm", "-f", "sglang-a")
    (inbox / "second").write_text(lines(2, 2.70, 3))
    new = run_container(engine, "sglang-a", inbox, "second")
    assert new != cid and not log.exists()
    wait_count(daemon, "sglang-a", 9, "3 + 4 + 2 lines after re-creation")
    assert accept_length(daemon, "sglang-a") == 2.70


def test_json_file_rotation_loses_and_repeats_no_line(tmp_path, engine, daemon):
    """max-size=2k, max-file=5: 40 lines (about 13 kB of records) rotate the file 6 times;
    Docker keeps the live file and 4 rotated ones (`-json.log.1` ... `.4`)."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "run.sh").write_text(RUN)
    (inbox / "many").write_text(lines(40, 3.30, 4))
    run_container(engine, "sglang-b", inbox, "many", "max-size=2k", "max-file=5")
    wait_count(daemon, "sglang-b", 40, "all 40 lines across the rotations")
    log = engine.log_path("sglang-b")
    assert sorted(p.name[len(log.name):] for p in log.parent.glob(log.name + "*")) == ["", ".1", ".2", ".3", ".4"]
    assert accept_length(daemon, "sglang-b") == 3.30


# --- the project's Dockerfile ------------------------------------------------------------------

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specwatch-tests"
BASE_MAX_AGE = 7 * 86400  # seconds a cached Debian root file system is reused


def debian_python_rootfs() -> Path:
    """A minbase Debian 12 root file system with Python 3.11 and pip, as a tar file: built with
    mmdebstrap from the machine's apt mirror (a minute or more), kept in CACHE for a week (like
    pip's cache: a stale base is still a valid one)."""
    tar = CACHE / "debian-bookworm-python3.tar"
    if tar.exists() and time.time() - tar.stat().st_mtime < BASE_MAX_AGE:
        return tar
    if shutil.which("mmdebstrap") is None:
        why = "real Docker: mmdebstrap not installed (Debian package mmdebstrap; .ci/run installs it)"
        pytest.fail(why) if os.environ.get("CI") == "true" else pytest.skip(why)
    CACHE.mkdir(parents=True, exist_ok=True)
    part = tar.with_suffix(".part")
    r = subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", "--include=python3,python3-pip,passwd",
                        "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
                        "--format=tar", "bookworm", str(part)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        part.unlink(missing_ok=True)
        why = f"real Docker: mmdebstrap failed: {r.stderr.strip()[-500:]}"
        pytest.fail(why) if os.environ.get("CI") == "true" else pytest.skip(why)
    part.rename(tar)
    return tar


# The stand-in's own layer: pip installs into this Python (as in the official image) and from the
# wheelhouse (no index is reachable from a build here).
BASE_LAYER = """FROM local/debian-python3:bookworm
COPY wheelhouse /opt/wheelhouse
RUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \\
    && printf '[global]\\nno-index = true\\nfind-links = /opt/wheelhouse\\n' > /etc/pip.conf
"""


@pytest.fixture(scope="module")
def python_slim(engine, wheels, tmp_path_factory):
    """A local stand-in for `python:3.11-slim` (no registry here): Debian 12's Python 3.11 and pip
    (`debian_python_rootfs`, `docker import`), plus a wheelhouse of this checkout's dependencies
    that its pip.conf points at; tagged `python:3.11-slim` for the project's Dockerfile."""
    engine.docker("import", str(debian_python_rootfs()), "local/debian-python3:bookworm", timeout=300)
    ctx = tmp_path_factory.mktemp("python-slim")
    shutil.copytree(wheels, ctx / "wheelhouse")
    (ctx / "Dockerfile").write_text(BASE_LAYER)
    engine.docker("build", "--network", "none", "-q", "-t", "python:3.11-slim", str(ctx), timeout=300)
    return "python:3.11-slim"


def test_the_dockerfile_builds_and_its_image_reads_the_hosts_container_logs(tmp_path, engine, python_slim):
    r = engine.docker("build", "--network", "none", "-q", "-t", "specwatch:test", str(ROOT), timeout=600)
    assert r.stdout.decode().startswith("sha256:"), r.stdout
    assert engine.out("run", "--rm", "--network", "none", "specwatch:test", "--version") == "specwatch 0.1.0"
    assert engine.out("image", "inspect", "-f", "{{.Config.User}}", "specwatch:test") == "65532:65532"

    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "run.sh").write_text(RUN)
    (inbox / "batch").write_text(lines(3, 3.40, 5))
    run_container(engine, "sglang-c", inbox, "batch")
    port = free_port()
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "config.yaml").write_text(yaml.safe_dump({
        "logs": [{"path": "/var/lib/docker/containers/*/*-json.log", "server": "{container}"}],
        "metrics": {"listen_port": port}, "gpu": {"enabled": False}, "process": {"enabled": False},
        "follow": {"poll_interval": "0.2s", "rescan_interval": "0.5s"}}))
    # README: root in the container, the containers' folder read-only (each is root-only, 0700)
    engine.docker("run", "-d", "--name", "specwatch-image", "--user", "0", "--network", "host",
                  "-v", f"{engine.data}/containers:/var/lib/docker/containers:ro", "-v", f"{etc}:/etc/specwatch:ro",
                  "specwatch:test")
    want = ("specwatch_log_lines_total", (("kind", "decode"), ("server", "sglang-c")))

    def read():
        try:
            return scrape(port).get(want) == 3
        except OSError:
            return False

    try:
        wait_for(read, timeout=60, interval=0.5, what="the image's specwatch to read sglang-c's 3 lines")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{engine.docker('logs', 'specwatch-image', check=False).stderr.decode()[-3000:]}")
    finally:
        engine.docker("rm", "-f", "specwatch-image", "sglang-c", check=False)
