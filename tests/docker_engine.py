"""A real Docker engine for the tests: Debian's `docker.io` (dockerd 20.10) started by hand with
its own data root, exec root and socket under a temporary folder, so it touches no other engine
on the host: `--iptables=false --bridge=none` (containers run with `--network none`, or `host`
for a build that needs PyPI). Its containers' logs are in `<data root>/containers/<id>/
<id>-json.log`, with json-file, Docker's default driver. No registry is reachable here: images
come from `docker import` of a root file system built locally (`busybox_image`: the static
busybox of Debian's `busybox-static`, about 2 MB). Measured here: the engine is up in about 1 s,
an import takes under a second.

`missing()` names what this host lacks; the tests skip on a developer's machine with that line
and fail in CI (`CI=true`, .ci/run installs the packages).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
from pathlib import Path

import procs

DOCKERD = "/usr/sbin/dockerd"
DOCKER = "/usr/bin/docker"  # Debian's client, matching its engine
BUSYBOX = "/bin/busybox"


def missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (dockerd)"
    if not (os.access(DOCKERD, os.X_OK) and os.access(DOCKER, os.X_OK)):
        return "dockerd not installed (Debian package docker.io; .ci/run installs it)"
    if not os.access(BUSYBOX, os.X_OK):
        return "busybox missing (Debian package busybox-static; .ci/run installs it)"
    return None


class Engine:
    """A running dockerd; `docker(*args)` runs the client against it; `data` is its data root."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="dockerd-"))
        self.data = self.dir / "data"
        self.sock = self.dir / "docker.sock"
        self._log = open(self.dir / "dockerd.log", "wb")
        self.proc = procs.popen([DOCKERD, "--data-root", str(self.data), "--exec-root", str(self.dir / "exec"),
                                 "--pidfile", str(self.dir / "dockerd.pid"), "--host", f"unix://{self.sock}",
                                 "--iptables=false", "--ip-masq=false", "--bridge=none"],
                                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            procs.wait_for(self._up, timeout=60, interval=0.2, what="dockerd to answer")
        except BaseException:
            self.close()
            raise

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"dockerd exited {self.proc.returncode}: "
                                 f"{(self.dir / 'dockerd.log').read_text()[-2000:]}")
        return self.docker("version", check=False).returncode == 0

    def docker(self, *args: str, check: bool = True, timeout: float = 120, input: bytes | None = None
               ) -> subprocess.CompletedProcess:
        r = subprocess.run([DOCKER, "-H", f"unix://{self.sock}", *args], capture_output=True, timeout=timeout,
                           input=input)
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)} exited {r.returncode}: {r.stderr.decode()[-2000:]}")
        return r

    def out(self, *args: str) -> str:
        return self.docker(*args).stdout.decode().strip()

    def import_rootfs(self, rootfs: Path, tag: str) -> None:
        """`tar -C rootfs -c . | docker import - tag`."""
        tar = self.dir / "rootfs.tar"
        with tarfile.open(tar, "w") as t:
            t.add(rootfs, arcname=".")
        self.docker("import", str(tar), tag)
        tar.unlink()

    def busybox_image(self, tag: str = "local/busybox:1") -> str:
        root = self.dir / "busybox-root"
        (root / "bin").mkdir(parents=True)
        shutil.copy2(BUSYBOX, root / "bin" / "busybox")
        for name in ("sh", "cat", "echo", "sleep"):
            (root / "bin" / name).symlink_to("busybox")
        self.import_rootfs(root, tag)
        return tag

    def log_path(self, container: str) -> Path:
        return Path(self.out("inspect", "-f", "{{.LogPath}}", container))

    def close(self) -> None:
        if self.proc.poll() is None:
            ids = self.docker("ps", "-aq", check=False).stdout.decode().split()
            if ids:
                self.docker("rm", "-f", *ids, check=False)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        # overlay2 mounts of containers that dockerd could not unmount would keep files busy
        for line in Path("/proc/mounts").read_text().splitlines():
            where = line.split()[1]
            if where.startswith(str(self.dir) + "/"):
                subprocess.run(["umount", "-l", where], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
