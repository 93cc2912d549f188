"""A real systemd booted under `systemd-nspawn`, for the tests of the shipped unit and install.sh.

The guest's root is an overlay of this machine's own `/` (lower `/`, upper a tmpfs; nspawn
refuses `-D /` itself), so it has this machine's Python, journalctl and util-linux and costs no
download; what the guest writes lands in the tmpfs and is gone after `close()`. On a host
without systemd as PID 1 nspawn needs `--register=no --keep-unit` (else "Failed to open system
bus"); `--private-network` gives it only a loopback, so nothing it does reaches the network and
pip installs from a wheelhouse built here. Commands run inside with `nsenter -t <guest PID 1> -a`.
Measured on Debian 12 (systemd 252): the guest is up in about 5 s ("degraded": units of this
machine that cannot run in a container fail).

`missing()` says what this host lacks (root, the `systemd-container` package, overlayfs);
the tests skip on a developer's machine with that line and fail in CI (`CI=true`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

import procs

SYSTEMD = "/lib/systemd/systemd"
# The guest's PATH: what `sudo` gives a command on Debian (secure_path in /etc/sudoers), as the
# README's `sudo ...` commands run.
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Units of this machine the guest must not start (they would run a second engine beside the
# tests' own): masked in the guest only.
MASKED = ("docker.service", "docker.socket", "containerd.service")


def missing() -> str | None:
    """What keeps a guest from booting here, as one line with the fix, or None."""
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn, mount)"
    if shutil.which("systemd-nspawn") is None or shutil.which("nsenter") is None:
        return "systemd-nspawn not installed (Debian package systemd-container; .ci/run installs it)"
    if not os.path.exists(SYSTEMD):
        return f"{SYSTEMD} missing (Debian package systemd)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs (modprobe overlay)"
    return None


class Guest:
    """A booted guest; `sh(cmd)` runs a shell command in it as root; `path(p)` is the host path of
    the guest's file p (written through the overlay, seen at once inside). `close()` powers it off
    and unmounts everything."""

    def __init__(self, name: str = "specwatch-test") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="nspawn-"))
        self.root = self.dir / "root"
        self.upper = self.dir / "upper"
        self.root.mkdir()
        self.upper.mkdir()
        self._mounted: list[Path] = []
        self.proc: subprocess.Popen | None = None
        self.console = self.dir / "console.log"
        try:
            self._mount("tmpfs", "tmpfs", self.upper, "mode=0755")
            (self.upper / "u").mkdir()
            (self.upper / "w").mkdir()
            self._mount("overlay", "overlay", self.root, f"lowerdir=/,upperdir={self.upper}/u,workdir={self.upper}/w")
            for unit in MASKED:  # this machine's engines: not started in the guest
                link = self.path(f"/etc/systemd/system/{unit}")
                link.unlink(missing_ok=True)
                link.symlink_to("/dev/null")
            with open(self.console, "wb") as out:
                self.proc = procs.popen(
                    ["systemd-nspawn", "-q", "-D", str(self.root), "--boot", "--register=no", "--keep-unit",
                     "--private-network", "--console=pipe", f"--machine={name}-{os.getpid()}"],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
            self.pid1 = procs.wait_for(self._init_pid, timeout=30, what="the guest's systemd")
            procs.wait_for(lambda: self.sh("systemctl is-system-running", check=False).stdout.strip()
                           in ("running", "degraded"), timeout=90, interval=0.5, what="the guest to boot")
        except BaseException:
            self.close()
            raise

    def _mount(self, fstype: str, what: str, where: Path, options: str) -> None:
        subprocess.run(["mount", "-t", fstype, "-o", options, what, str(where)], check=True, capture_output=True)
        self._mounted.append(where)

    def _init_pid(self) -> int | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"systemd-nspawn exited {self.proc.returncode}: {self.console.read_text()[-2000:]}")
        kids = [c for c in psutil.Process(self.proc.pid).children() if c.name() == "systemd"]
        return kids[0].pid if kids else None

    def path(self, p: str) -> Path:
        return self.root / p.lstrip("/")

    def sh(self, cmd: str, *, check: bool = True, timeout: float = 120, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess:
        """`cmd` run by /bin/sh in the guest (all its namespaces, its root), as root, with
        PATH and `env`. check: raise AssertionError with the output on a non-zero exit."""
        environ = {"PATH": PATH, "HOME": "/root", "LC_ALL": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0",
                   **(env or {})}
        r = subprocess.run(["nsenter", "-t", str(self.pid1), "-a", "--", "/usr/bin/env", "-i",
                            *(f"{k}={v}" for k, v in environ.items()), "/bin/sh", "-c", cmd],
                           capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"in the guest: {cmd!r} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # nspawn: a clean poweroff of the guest
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for where in reversed(self._mounted):
            for _ in range(20):
                if subprocess.run(["umount", str(where)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                subprocess.run(["umount", "-l", str(where)], capture_output=True)
        self._mounted.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
