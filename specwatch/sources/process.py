"""The SGLang server processes, through psutil: identity, settings, interpreter, CPU and memory.

A server is a *launcher* process — `python -m sglang.launch_server ...`, `python .../sglang/
launch_server.py ...`, `sglang serve ...` (or a command line matching `process.match`) — whose
ancestors are not launchers (a forked child keeps its parent's command line until it renames
itself), plus every descendant. SGLang renames its children with setproctitle:
`sglang::scheduler_DP0_TP0`, `sglang::detokenizer`, `sglang::data_parallel_controller`
(`managers/scheduler.py`, `detokenizer_manager.py`, `data_parallel_controller.py`, 0.4.6-0.5.23);
the role is that name without `sglang::` and the rank suffix; the launcher is `main` (HTTP server
and tokenizer manager); anything else is `other`.

Servers are told apart by `--port` (default 30000). `ProcessSource` scans every `interval`
seconds and emits, per server: `ProcessSample` each scan, `ServerStarted` when one appears,
`ServerRestarted` when the launcher's pid or start time changed, `ServerDown` when it is gone.
It never reads the processes' memory and never runs their interpreter: the SGLang version comes
from the `sglang` distribution metadata in the site-packages that interpreter would use.

Permissions: command lines, CPU and RSS of any user's processes are readable; the environment,
working directory, `exe` and fd targets need the same user or root (CAP_SYS_PTRACE) and are
simply left out otherwise.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import threading
import time
from pathlib import PurePosixPath
from typing import Iterable, Iterator

import psutil
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specwatch.events import (
    ProcessSample,
    RoleUsage,
    ServerArgs,
    ServerDown,
    ServerProcess,
    ServerRestarted,
    ServerStarted,
)
from specwatch.sources.base import Emit, PollingSource

log = logging.getLogger("specwatch.sources.process")

DEFAULT_PORT = 30000  # SGLang's --port default (server_args.py, all versions)

# flag -> (ServerArgs field, converter). Names and aliases: sglang.md §7 (0.5.23 arg groups;
# `--model`, `--tp`, `--dp` are accepted by argparse as alias or unique prefix).
_INT, _STR, _UPPER, _TRUE = int, str, str.upper, None
_FLAGS: dict[str, tuple[str, object]] = {
    "--model-path": ("model_path", _STR),
    "--model": ("model_path", _STR),
    "--served-model-name": ("served_model_name", _STR),
    "--speculative-algorithm": ("speculative_algorithm", _UPPER),
    "--speculative-draft-model-path": ("speculative_draft_model_path", _STR),
    "--speculative-draft-model": ("speculative_draft_model_path", _STR),
    "--speculative-draft-model-revision": ("speculative_draft_model_revision", _STR),
    "--speculative-num-steps": ("speculative_num_steps", _INT),
    "--speculative-eagle-topk": ("speculative_eagle_topk", _INT),
    "--speculative-num-draft-tokens": ("speculative_num_draft_tokens", _INT),
    "--tp-size": ("tp_size", _INT),
    "--tensor-parallel-size": ("tp_size", _INT),
    "--dp-size": ("dp_size", _INT),
    "--data-parallel-size": ("dp_size", _INT),
    "--pp-size": ("pp_size", _INT),
    "--pipeline-parallel-size": ("pp_size", _INT),
    "--ep-size": ("ep_size", _INT),
    "--expert-parallel-size": ("ep_size", _INT),
    "--port": ("port", _INT),
    "--host": ("host", _STR),
    "--log-level": ("log_level", _STR),
    "--decode-log-interval": ("decode_log_interval", _INT),
    "--enable-metrics": ("enable_metrics", _TRUE),
    "--disaggregation-mode": ("disaggregation_mode", _STR),
}
# Real SGLang flags that start like the ones above. A command line that is running was accepted
# by its SGLang's argparse, so an abbreviation that matches one field above is that field (e.g.
# `--speculative-draft` from 0.4-era docs, ambiguous only in versions that added
# `--speculative-draft-window-size`); only an exact sibling name is someone else's flag.
_SIBLINGS = frozenset((
    "--speculative-accept-threshold-single", "--speculative-accept-threshold-acc",
    "--speculative-token-map", "--speculative-attention-mode", "--speculative-adaptive",
    "--speculative-draft-model-quantization", "--speculative-draft-load-format",
    "--speculative-draft-window-size", "--speculative-use-rejection-sampling",
    "--model-impl", "--model-loader-extra-config", "--model-checksum",
    "--log-level-http", "--log-requests", "--log-requests-level", "--log-requests-format",
    "--pp-max-micro-batch-size", "--pp-async-batch-depth", "--enable-metrics-for-all-schedulers",
    "--ep-dispatch-algorithm", "--ep-num-redundant-experts", "--host-ip",
))
# values never kept in a command line specwatch stores, logs or sends
_SECRET_FLAG = re.compile(r"^--[\w-]*(?:key|secret|password)$|^--[\w-]*-token$")
_ROLE_SUFFIX = re.compile(r"(?:_[A-Z][A-Z_]*?\d+)+$")
_PY_VERSION = re.compile(r"python(\d+\.\d+)")


# ------------------------------------------------------------------ command lines


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
    argv = list(argv)
    prog = PurePosixPath(argv[0]).name
    if prog == "sglang":
        return list(argv[2:]) if argv[1:2] == ["serve"] else None
    if not prog.startswith(("python", "pypy")):
        return None
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "-m" or (tok.startswith("-m") and not tok.startswith("--")):
            mod = argv[i + 1] if tok == "-m" and i + 1 < len(argv) else tok[2:]
            rest = list(argv[i + 2:] if tok == "-m" else argv[i + 1:])
            if mod == "sglang.launch_server":
                return rest
            if mod == "sglang" and rest[:1] == ["serve"]:
                return rest[1:]
            return None
        if tok in ("-X", "-W", "--check-hash-based-pycs"):
            i += 2  # an interpreter option with a separate argument
            continue
        if tok.startswith("-c") or tok == "-":
            return None  # a -c program or stdin
        if tok.startswith("-"):
            i += 1
            continue
        path = PurePosixPath(tok)
        if path.name == "launch_server.py" and path.parent.name == "sglang":
            return list(argv[i + 1:])
        if path.name == "sglang" and argv[i + 1:i + 2] == ["serve"]:
            return list(argv[i + 2:])
        return None
    return None


def _resolve_flag(name: str) -> str | None:
    if name in _FLAGS:
        return name
    if name in _SIBLINGS or len(name) < 4:
        return None
    # first in _FLAGS order, which lists the older flag first: a running server's SGLang accepted
    # the abbreviation, so it predates the flags that made it ambiguous
    return next((f for f in _FLAGS if f.startswith(name)), None)


def parse_server_argv(args: list[str]) -> dict[str, object]:
    """SGLang server flags → ServerArgs field values (sglang.md §7).

    Handles `--flag value`, `--flag=value`, argparse prefix abbreviations (`--speculative-algo`),
    aliases (`--model`, `--tp`, `--speculative-draft-model`), store-true flags and repeats (the
    last one wins, as in argparse). `speculative_algorithm` is upper-cased (SGLang does too);
    `NEXTN` is kept as typed (SGLang resolves it to EAGLE later). Flags specwatch does not use
    are skipped; a value that does not convert is kept as text.
    """
    out: dict[str, object] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("--"):
            continue
        name, eq, value = tok.partition("=")
        flag = _resolve_flag(name)
        if flag is None:
            continue
        field, conv = _FLAGS[flag]
        if conv is _TRUE:
            out[field] = True
            continue
        if not eq:
            if i >= len(args) or args[i].startswith("--"):
                continue  # no value: argparse would have failed, so this is not a live server
            value = args[i]
            i += 1
        try:
            out[field] = conv(value)
        except ValueError:
            out[field] = value
    return out


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


def role_of(argv: list[str] | tuple[str, ...]) -> str:
    """`sglang::scheduler_DP0_TP0` → `scheduler`; anything not renamed by SGLang → `other`."""
    first = argv[0].strip() if argv else ""
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
    seen: set[str] = set()
    return [d for d in dirs if not (d in seen or seen.add(d))]


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


_VERSION_PY = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)


def find_sglang(interpreter: str, fs_root: str = "/", environ: dict[str, str] | None = None
                ) -> tuple[str | None, str | None]:
    """(version, site directory) of the `sglang` package that interpreter imports first.

    Read from `sglang-*.dist-info` / `.egg-info` metadata (pip, uv, conda, editable installs),
    else from `sglang/version.py` (a source tree on PYTHONPATH). (None, None) when not found.
    sglang is never imported: that would load torch and CUDA into specwatch.
    """
    host = _host(fs_root)
    for d in site_dirs(interpreter, fs_root, environ):
        hd = host(d)
        if not os.path.isdir(hd):
            continue
        for dist in importlib.metadata.distributions(name="sglang", path=[hd]):
            version = dist.version
            if version:
                return version, d
        try:
            with open(os.path.join(hd, "sglang", "version.py"), encoding="utf-8") as f:
                m = _VERSION_PY.search(f.read(4096))
            if m:
                return m.group(1), d
        except OSError:
            continue
    return None, None


# ------------------------------------------------------------------ the scan


class _Proc:
    __slots__ = ("p", "pid", "ppid", "cmdline", "create_time")

    def __init__(self, p: psutil.Process, info: dict):
        self.p = p
        self.pid = info["pid"]
        self.ppid = info.get("ppid") or 0
        self.cmdline = tuple(info.get("cmdline") or ())
        self.create_time = info.get("create_time") or 0.0


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


class ProcessSource(PollingSource):
    """Scans the process table every `interval` seconds; see the module docstring.

    emit: `(server, event, now)` callback. server: the default server name. servers: --port →
    server name; when given, only those ports are watched and a missing one is reported down
    even if it was never seen; when empty, every SGLang server on the box is watched: the first
    port seen is named `server` (for good), other ports `server:port`. match: a regex; when set, a process whose
    joined command line matches it is a launcher too (wrappers, custom entry points).
    """

    name = "process"

    def __init__(self, emit: Emit, *, server: str, interval: float = 5.0,
                 servers: dict[int, str] | None = None, match: str | None = None):
        super().__init__(interval)
        self.emit = emit
        self.server = server
        self.servers = dict(servers or {})
        self.match = re.compile(match) if match else None
        self._lock = threading.Lock()
        self._current: dict[str, ServerProcess] = {}
        self._last_known: dict[str, ServerProcess] = {}
        self._install_cache: dict[tuple[int, float], tuple[str | None, str | None, str | None, str]] = {}
        self.scans_total = 0
        self.scan_errors_total = 0
        self.last_scan_duration: float | None = None
        self.restarts_total: dict[str, int] = {}
        self._plain_port: int | None = None

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
        if args is None and self.match is not None and cmdline and self.match.search(" ".join(cmdline)):
            args = list(cmdline[1:])
        return args

    def scan(self) -> dict[str, ServerProcess]:
        """One pass over the process table → {server name: ServerProcess}."""
        procs: dict[int, _Proc] = {}
        launchers: dict[int, list[str]] = {}
        for p in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"]):
            info = p.info
            if info.get("cmdline") is None:
                continue  # gone, a zombie, or hidden (hidepid)
            pr = _Proc(p, info)
            procs[pr.pid] = pr
            args = self._args_of(pr.cmdline)
            if args is not None:
                launchers[pr.pid] = args
        children: dict[int, list[int]] = {}
        for pr in procs.values():
            children.setdefault(pr.ppid, []).append(pr.pid)
        found: dict[int, ServerProcess] = {}
        for pid, args in launchers.items():
            anc, seen = procs[pid].ppid, set()
            while anc in procs and anc not in seen and anc not in launchers:
                seen.add(anc)
                anc = procs[anc].ppid
            if anc in launchers:
                continue  # a forked child of a launcher, not a server of its own
            sp = self._describe(procs, children, pid, args)
            if sp is not None:
                found[pid] = sp
        return self._name(found)

    def _name(self, found: dict[int, ServerProcess]) -> dict[str, ServerProcess]:
        out: dict[str, ServerProcess] = {}
        for sp in sorted(found.values(), key=lambda s: s.start_time):
            if self.servers:
                name = self.servers.get(sp.port)
                if name is None:
                    continue
            else:
                if self._plain_port is None:
                    self._plain_port = sp.port  # the first port seen keeps the plain name
                name = self.server if sp.port == self._plain_port else f"{self.server}:{sp.port}"
            out.setdefault(name, sp)  # two servers on one port (two netns): the oldest
        return out

    def _describe(self, procs: dict[int, _Proc], children: dict[int, list[int]], pid: int,
                  args: list[str]) -> ServerProcess | None:
        root = procs[pid]
        tree, stack = [], [pid]
        while stack:
            cur = stack.pop()
            tree.append(cur)
            stack.extend(children.get(cur, ()))
        roles: dict[str, list[float]] = {}
        outputs: list[str] = []
        for cpid in tree:
            pr = procs[cpid]
            role = "main" if cpid == pid else role_of(pr.cmdline)
            try:
                with pr.p.oneshot():
                    t = pr.p.cpu_times()
                    rss = pr.p.memory_info().rss
            except psutil.Error:
                continue  # exited during the scan
            acc = roles.setdefault(role, [0, 0.0, 0])
            acc[0] += 1
            acc[1] += t.user + t.system
            acc[2] += rss
            if role in ("main", "scheduler"):
                for fd in (1, 2):
                    target = _fd_target(cpid, fd)
                    if target and target not in outputs:
                        outputs.append(target)
        if "main" not in roles:
            return None  # the launcher itself exited during the scan
        parsed = parse_server_argv(args)
        key = (pid, root.create_time)
        cached = self._install_cache.get(key)
        if cached is None:
            fs_root = _fs_root(pid)
            interp = _interpreter(root.p, root.cmdline, fs_root)
            version = location = None
            if interp:
                try:
                    environ = root.p.environ()
                except (psutil.Error, OSError):
                    environ = {}
                version, location = find_sglang(interp, fs_root, environ)
            cached = (interp, version, location, fs_root)
            if len(self._install_cache) > 64:
                self._install_cache.clear()
            self._install_cache[key] = cached
        interp, version, location, fs_root = cached
        port = parsed.get("port")
        return ServerProcess(
            pid=pid,
            start_time=root.create_time,
            port=port if isinstance(port, int) else DEFAULT_PORT,
            cmdline=redact_argv(root.cmdline),
            args=parsed,
            interpreter=interp,
            fs_root=fs_root,
            sglang_version=version,
            sglang_location=location,
            pids=tuple(sorted(tree)),
            roles={r: RoleUsage(int(a[0]), float(a[1]), int(a[2])) for r, a in roles.items()},
            output_paths=tuple(outputs),
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
            if new is not None:
                if old is None:
                    self.emit(name, ServerStarted(now, new, first_seen=known is None, previous=known), now)
                    if known is not None and known.identity != new.identity:
                        self._restarted(name, known, new, now)
                elif old.identity != new.identity:
                    self._restarted(name, old, new, now)
                if known is None or known.identity != new.identity:
                    self.emit(name, ServerArgs(now, dict(new.args), source="cmdline"), now)
                    log.info("SGLang server %s: pid %d, port %d, sglang %s, interpreter %s",
                             name, new.pid, new.port, new.sglang_version or "unknown", new.interpreter or "unknown")
                self._last_known[name] = new
            elif old is not None:
                log.warning("SGLang server %s (pid %d) is gone", name, old.pid)
                self.emit(name, ServerDown(now, old), now)
            self.emit(name, ProcessSample(now, new), now)

    def _restarted(self, name: str, old: ServerProcess, new: ServerProcess, now: float) -> None:
        self.restarts_total[name] = self.restarts_total.get(name, 0) + 1
        log.warning("SGLang server %s restarted: pid %d -> %d", name, old.pid, new.pid)
        self.emit(name, ServerRestarted(now, old, new), now)


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
        yield scans
        yield errors
        if s.last_scan_duration is not None:
            d = GaugeMetricFamily("specwatch_process_scan_duration_seconds", "Seconds the last scan took.")
            d.add_metric([], s.last_scan_duration)
            yield d
