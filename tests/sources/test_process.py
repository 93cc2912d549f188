"""ProcessSource against real processes: a fake SGLang install in a real venv, launched the way
users launch SGLang, found through psutil, restarted, killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from fake_sglang import launch, stop, wait_children  # noqa: E402
from procs import free_port, popen, popen_at, wait_for  # noqa: E402

from specwatch.core.events import (  # noqa: E402
    ProcessSample,
    ServerArgs,
    ServerDown,
    ServerRestarted,
    ServerStarted,
)
from specwatch.sources import process as process_mod  # noqa: E402
from specwatch.engines.sglang.settings import launcher_args  # noqa: E402
from specwatch.sources.process import (  # noqa: E402
    ProcessSource,
    find_sglang,
    redact_argv,
    role_of,
    site_dirs,
)

MODEL = "/models/meta-llama/Llama-3.1-8B-Instruct"
DRAFT = "/models/lmsys/sglang-EAGLE3-LLaMA3.1-Instruct-8B"


def server_argv(python: Path, port: int, *, steps: int = 5, extra: tuple[str, ...] = ()) -> list[str]:
    return [str(python), "-m", "sglang.launch_server", "--model-path", MODEL,
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", DRAFT,
            "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "8",
            "--speculative-num-draft-tokens", "32", "--tp", "1", "--port", str(port),
            "--mem-fraction-static", "0.8", "--api-key", "sk-secret-123", *extra]


class Recorder:
    def __init__(self):
        self.events: list[tuple[str, object]] = []

    def __call__(self, server, event, now):
        self.events.append((server, event))

    def of(self, kind):
        return [e for _, e in self.events if isinstance(e, kind)]

    def clear(self):
        self.events.clear()


# ------------------------------------------------------------------ command lines (pure)


@pytest.mark.parametrize("argv, expected", [
    (["/opt/venv/bin/python3", "-m", "sglang.launch_server", "--model-path", "m"], ["--model-path", "m"]),
    (["python3", "-u", "-X", "faulthandler", "-m", "sglang.launch_server", "--port", "1"], ["--port", "1"]),
    (["/usr/bin/python3.11", "/opt/venv/bin/sglang", "serve", "--model-path", "m"], ["--model-path", "m"]),
    (["sglang", "serve", "--tp", "8"], ["--tp", "8"]),
    (["python", "-m", "sglang", "serve", "--tp", "8"], ["--tp", "8"]),
    (["python", "/src/sglang/python/sglang/launch_server.py", "--port", "2"], ["--port", "2"]),
    (["python", "-msglang.launch_server", "--port", "3"], ["--port", "3"]),
    (["tail", "-F", "/var/log/sglang.launch_server.log"], None),
    (["python", "-c", "import sglang.launch_server"], None),
    (["bash", "-c", "python -m sglang.launch_server --port 1"], None),
    (["python", "-m", "sglang.bench_serving", "--port", "1"], None),
    (["python", "-m", "pytest", "sglang.launch_server"], None),
    (["sglang::scheduler_TP0"], None),
    (("/v/bin/python", "/v/bin/sglang", "serve", "--port", "1"), ["--port", "1"]),
])
def test_launcher_args(argv, expected):
    assert launcher_args(argv) == expected


def test_redact_api_key_both_forms():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", "sk-1", "--admin-api-key=sk-2",
            "--speculative-num-draft-tokens", "4"]
    assert redact_argv(argv) == ("python", "-m", "sglang.launch_server", "--api-key", "<redacted>",
                                 "--admin-api-key=<redacted>", "--speculative-num-draft-tokens", "4")


@pytest.mark.parametrize("argv, role", [
    (["sglang::scheduler_DP0_TP0"], "scheduler"), (["sglang::scheduler"], "scheduler"),
    (["sglang::detokenizer"], "detokenizer"), (["sglang::data_parallel_controller"], "data_parallel_controller"),
    (["python", "-c", "from multiprocessing.spawn import spawn_main"], "other"), ([], "other"),
])
def test_role_of(argv, role):
    assert role_of(argv) == role


# ------------------------------------------------------------------ the install


def test_find_sglang_in_venv_metadata(sglang_install):
    version, location = find_sglang(str(sglang_install))
    assert version == "0.5.6.post2"
    assert location == str(sglang_install.parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages")


def test_pythonpath_source_tree_comes_first(sglang_install, tmp_path):
    src = tmp_path / "checkout" / "python"
    (src / "sglang").mkdir(parents=True)
    (src / "sglang" / "version.py").write_text('__version__ = "0.5.23"\n')
    assert site_dirs(str(sglang_install), environ={"PYTHONPATH": str(src)})[0] == str(src)
    assert find_sglang(str(sglang_install), environ={"PYTHONPATH": str(src)}) == ("0.5.23", str(src))


def _dist(site: Path, version: str) -> None:
    d = site / f"sglang-{version}.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")


def test_container_root_venv_and_debian_python(tmp_path):
    """Paths as the server sees them, read under its root (/proc/<pid>/root for a container)."""
    root = tmp_path / "rootfs"
    venv_dir = root / "opt" / "venv"
    (venv_dir / "bin").mkdir(parents=True)
    (venv_dir / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.10.12\n")
    _dist(venv_dir / "lib" / "python3.10" / "site-packages", "0.5.9")
    assert find_sglang("/opt/venv/bin/python3", fs_root=str(root)) == ("0.5.9", "/opt/venv/lib/python3.10/site-packages")

    # Debian's python3 -> python3.10 symlink; pip installs to /usr/local/lib/python3.10/dist-packages;
    # the user site comes first
    usr_bin = root / "usr" / "bin"
    usr_bin.mkdir(parents=True)
    (usr_bin / "python3.10").write_text("")
    (usr_bin / "python3").symlink_to("python3.10")
    _dist(root / "usr" / "local" / "lib" / "python3.10" / "dist-packages", "0.5.4")
    assert find_sglang("/usr/bin/python3", fs_root=str(root)) == ("0.5.4", "/usr/local/lib/python3.10/dist-packages")
    _dist(root / "home" / "ml" / ".local" / "lib" / "python3.10" / "site-packages", "0.5.23")
    assert find_sglang("/usr/bin/python3", fs_root=str(root), environ={"HOME": "/home/ml"}) == (
        "0.5.23", "/home/ml/.local/lib/python3.10/site-packages")


def test_no_sglang_anywhere(tmp_path):
    root = tmp_path / "empty"
    import venv
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    assert find_sglang(str(root / "bin" / "python")) == (None, None)


# ------------------------------------------------------------------ real processes


def test_finds_launcher_children_args_usage(sglang_install, sglang_procs, tmp_path):
    port = free_port()
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        p = sglang_procs.start(server_argv(sglang_install, port), stdout=out)
    kids = psutil.Process(p.pid).children()
    rec = Recorder()
    src = ProcessSource(rec, server="gpu-box-1", interval=5, servers={port: "sglang-a"})
    src.poll(time.time())

    started = rec.of(ServerStarted)
    assert len(started) == 1 and started[0].first_seen
    sp = started[0].process
    assert sp.pid == p.pid
    assert sp.start_time == pytest.approx(psutil.Process(p.pid).create_time())
    assert sp.port == port
    assert sp.interpreter == str(sglang_install)  # the venv's bin/python, not the resolved system binary
    assert sp.fs_root == "/"
    assert sp.sglang_version == "0.5.6.post2"
    assert sp.args["speculative_algorithm"] == "EAGLE3"
    assert sp.args["speculative_draft_model_path"] == DRAFT
    assert (sp.args["speculative_num_steps"], sp.args["speculative_eagle_topk"],
            sp.args["speculative_num_draft_tokens"], sp.args["tp_size"]) == (5, 8, 32, 1)
    assert "sk-secret-123" not in " ".join(sp.cmdline)
    assert set(sp.pids) == {p.pid} | {k.pid for k in kids}
    assert set(sp.roles) == {"main", "scheduler", "detokenizer"}
    assert sp.roles["scheduler"].processes == 1
    assert sp.roles["main"].rss_bytes == pytest.approx(psutil.Process(p.pid).memory_info().rss, rel=0.5)
    assert sp.roles["main"].cpu_seconds > 0
    assert str(log) in sp.output_paths
    assert src.pids() == set(sp.pids)
    # the command line's settings also go to the rules as ServerArgs
    args = rec.of(ServerArgs)
    assert len(args) == 1 and args[0].source == "cmdline" and args[0].args["port"] == port
    assert rec.of(ProcessSample)[0].process is sp

    rec.clear()
    src.poll(time.time())  # nothing changed: only a sample
    assert [type(e).__name__ for _, e in rec.events] == ["ProcessSample"]


def test_restart_between_scans_then_down(sglang_install, sglang_procs):
    port = free_port()
    p1 = sglang_procs.start(server_argv(sglang_install, port, steps=5))
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=5, servers={port: "sglang-a"})
    src.poll(time.time())
    stop(p1)
    p2 = sglang_procs.start(server_argv(sglang_install, port, steps=3, extra=("--log-level", "warning")))
    rec.clear()
    src.poll(time.time())

    restarts = rec.of(ServerRestarted)
    assert len(restarts) == 1
    r = restarts[0]
    assert (r.old.pid, r.new.pid) == (p1.pid, p2.pid)
    assert r.old.args["speculative_num_steps"] == 5 and r.new.args["speculative_num_steps"] == 3
    assert r.new.args["log_level"] == "warning"
    assert src.restarts_total == {"sglang-a": 1}
    assert rec.of(ServerArgs)[0].args["speculative_num_steps"] == 3
    assert rec.of(ServerStarted) == [] and rec.of(ServerDown) == []

    stop(p2)
    rec.clear()
    src.poll(time.time())
    down = rec.of(ServerDown)
    assert len(down) == 1 and down[0].last.pid == p2.pid
    assert rec.of(ProcessSample)[0].process is None
    assert src.pids() == set()


def test_down_then_back_is_a_restart_too(sglang_install, sglang_procs):
    port = free_port()
    p1 = sglang_procs.start(server_argv(sglang_install, port))
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=5, servers={port: "s"})
    src.poll(time.time())
    stop(p1)
    src.poll(time.time())
    assert len(rec.of(ServerDown)) == 1
    # `sglang serve` through the venv's console script this time
    p2 = sglang_procs.start([str(sglang_install.parent / "sglang"), "serve", "--model-path", MODEL,
                             "--port", str(port), "--speculative-algorithm", "EAGLE3",
                             "--speculative-draft-model-path", DRAFT])
    rec.clear()
    src.poll(time.time())
    started = rec.of(ServerStarted)
    assert len(started) == 1 and not started[0].first_seen and started[0].previous.pid == p1.pid
    assert [(r.old.pid, r.new.pid) for r in rec.of(ServerRestarted)] == [(p1.pid, p2.pid)]
    sp = started[0].process
    assert sp.interpreter == str(sglang_install)  # from the console script's shebang line
    assert sp.sglang_version == "0.5.6.post2"
    assert src.restarts_total == {"s": 1}


def test_declared_server_never_seen_is_reported_missing(sglang_install):
    port = free_port()
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=5, servers={port: "sglang-a"})
    src.poll(time.time())
    assert [(s, e.process) for s, e in rec.events if isinstance(e, ProcessSample)] == [("sglang-a", None)]
    assert rec.of(ServerDown) == []  # nothing was up, so nothing went down


def test_undeclared_servers_are_shown_by_port_and_forgotten_when_gone(sglang_install, sglang_procs):
    ports = sorted([free_port(), free_port()])
    procs = {port: sglang_procs.start(server_argv(sglang_install, port)) for port in ports}
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=5)
    src.poll(time.time())
    ours = {f"box:{port}" for port in ports}
    samples = {s: e for s, e in rec.events if isinstance(e, ProcessSample) and s in ours}
    assert set(samples) == ours  # never the plain name: that is the followed log's server
    assert all(not e.expected and e.process.port == int(s.split(":")[1]) for s, e in samples.items())
    assert {type(e).__name__ for s, e in rec.events if s in ours} == {"ProcessSample"}  # no rule acts on them

    stop(procs[ports[0]])
    rec.clear()
    src.poll(time.time())
    gone = [(s, e) for s, e in rec.events if s == f"box:{ports[0]}"]
    assert [(type(e).__name__, e.process, e.expected) for _, e in gone] == [("ProcessSample", None, False)]
    assert rec.of(ServerDown) == []
    rec.clear()
    src.poll(time.time())
    assert [e for s, e in rec.events if s == f"box:{ports[0]}"] == []  # forgotten


def test_configured_by_followed_log_or_api_url(sglang_install, sglang_procs, tmp_path):
    from specwatch.config import ProcessTies, build_config

    log, api_port, other = tmp_path / "a.log", free_port(), free_port()
    cfg = build_config({"server": "box", "logs": [{"path": str(log), "server": "sglang-a"}],
                        "server_api": {"url": f"http://localhost:{api_port}", "server": "sglang-b"}})
    ties = ProcessTies.of(cfg)
    assert ties.configured == {"sglang-a", "sglang-b"}
    with open(log, "w") as out:
        a = sglang_procs.start(server_argv(sglang_install, other), stdout=out)
    b = sglang_procs.start(server_argv(sglang_install, api_port))
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=5, ties=ties)
    src.poll(time.time())
    found = {s: e.process.pid for s, e in rec.events if isinstance(e, ProcessSample) and e.process
             and e.process.pid in (a.pid, b.pid)}
    assert found == {"sglang-a": a.pid, "sglang-b": b.pid}
    stop(a)
    rec.clear()
    src.poll(time.time())
    assert [d.last.pid for d in rec.of(ServerDown)] == [a.pid]  # a configured server: down
    assert [(e.process, e.expected) for s, e in rec.events if s == "sglang-a" and isinstance(e, ProcessSample)] \
        == [(None, True)]


def test_a_process_that_execs_into_sglang_later_is_found(sglang_install, sglang_procs, tmp_path):
    """The scan reads a process once; one that becomes a launcher later (a wrapper's `exec`) is
    found at the next scan (a new process is read once more) or, while a declared server is
    missing, at once (every process is read again)."""
    soon, late = free_port(), free_port()
    rec = Recorder()
    auto = ProcessSource(rec, server="box", interval=5)
    declared = ProcessSource(rec, server="box", interval=5, servers={late: "later"})
    auto.poll(time.time())  # the box as it is
    declared.poll(time.time())

    def wrapper(port: int, go: Path) -> subprocess.Popen:  # `sh` until `go` exists, then the launcher
        return sglang_procs.start(["sh", "-c", f"while [ ! -e {go} ]; do sleep 0.02; done; "
                                   f"exec {' '.join(server_argv(sglang_install, port))}"], children=0)

    first, second = wrapper(soon, tmp_path / "go-soon"), wrapper(late, tmp_path / "go-late")
    auto.poll(time.time())  # both are still `sh`
    declared.poll(time.time())
    declared.poll(time.time())  # read again once: still `sh`

    def started():  # other SGLang processes on this box may be found too: only ours
        return list(dict.fromkeys((s, e.process.cmdline[1:3]) for s, e in rec.events
                                  if isinstance(e, ProcessSample) and e.process and e.process.port in (soon, late)))

    def execd(p: subprocess.Popen):  # the wrapper became the launcher (however slow the box)
        return lambda: psutil.Process(p.pid).cmdline()[1:3] == ["-m", "sglang.launch_server"]

    assert started() == []
    (tmp_path / "go-soon").touch()
    wait_for(execd(first), what="the first wrapper's exec")
    auto.poll(time.time())
    assert started() == [(f"box:{soon}", ("-m", "sglang.launch_server"))]
    (tmp_path / "go-late").touch()
    wait_for(execd(second), what="the second wrapper's exec")
    rec.clear()
    declared.poll(time.time())
    assert started() == [("later", ("-m", "sglang.launch_server"))]


def test_steady_scans_read_only_new_processes(sglang_install, sglang_procs):
    port = free_port()
    sglang_procs.start(server_argv(sglang_install, port))
    sleeps = [popen(["sleep", "60"]) for _ in range(40)]
    try:
        src = ProcessSource(Recorder(), server="box", interval=5, servers={port: "s"})
        src.poll(time.time())
        first = src.reads_total
        assert first >= len(psutil.pids()) - 10  # the first scan reads every process once
        src.poll(time.time())  # reads again the few first seen at the last scan (none here but churn)
        before = src.reads_total
        src.poll(time.time())
        assert src.reads_total - before < 20  # of 40+ sleeps and the box's processes: only new ones
        assert len(src.current()["s"].pids) == 3  # the server's own processes are still read
    finally:
        for p in sleeps:
            p.kill()
            p.wait()


def test_declared_servers_running_list_proc_only_every_list_every(sglang_install, sglang_procs, monkeypatch):
    """While every server of `servers` runs, a scan reads only their processes (O(SGLang
    processes)): the box's new processes are read at the next listing, LIST_EVERY later."""
    port = free_port()
    p = sglang_procs.start(server_argv(sglang_install, port))
    src = ProcessSource(Recorder(), server="box", interval=5, servers={port: "s"})
    src.poll(time.time())
    src.poll(time.time())
    before = src.reads_total
    sleeps = [popen(["sleep", "60"]) for _ in range(20)]
    try:
        src.poll(time.time())
        assert src.reads_total == before  # 20 new processes, none read
        monkeypatch.setattr(process_mod, "LIST_EVERY", 0.0)  # the next scan lists /proc
        src.poll(time.time())
        assert src.reads_total - before >= 20
    finally:
        for s in sleeps:
            s.kill()
            s.wait()
    assert len(src.current()["s"].pids) == 3 and p.pid in src.pids()


def test_declared_servers_running_need_no_full_pass(sglang_install, sglang_procs, monkeypatch):
    """A full pass re-reads every process of the box (O(all processes)); while every server of
    `servers` runs it would find nothing that matters, so it waits until one is missing."""
    port = free_port()
    p = sglang_procs.start(server_argv(sglang_install, port))
    src = ProcessSource(Recorder(), server="box", interval=5, servers={port: "s"})
    src.poll(time.time())
    src.poll(time.time())
    monkeypatch.setattr(process_mod, "FULL_PASS", 0.0)
    before = src.reads_total
    src.poll(time.time())
    assert src.reads_total == before and p.pid in src.pids()
    undeclared = ProcessSource(Recorder(), server="box", interval=5)  # every server matters: full passes
    undeclared.poll(time.time())
    before = undeclared.reads_total
    undeclared.poll(time.time())
    assert undeclared.reads_total - before >= len(psutil.pids()) - 10


def test_steady_scans_of_servers_tied_by_log_or_api_read_no_process_again(sglang_install, sglang_procs, monkeypatch):
    """Without `servers` (a server tied by its followed log or its server_api URL), once every
    configured server runs a scan reads their processes and the new ones, never every process
    of the box again, however often a full pass would be due (FULL_PASS)."""
    from specwatch.config import ProcessTies

    monkeypatch.setattr(process_mod, "FULL_PASS", 0.0)
    port = free_port()
    sglang_procs.start(server_argv(sglang_install, port))
    sleeps = [popen(["sleep", "60"]) for _ in range(300)]
    try:
        src = ProcessSource(Recorder(), server="box", interval=5,
                            ties=ProcessTies({}, {port: "api"}, frozenset({"api"})))
        src.poll(time.time())
        assert src.reads_total >= len(psutil.pids()) - 10  # the first scan reads every process once
        src.poll(time.time())
        before = src.reads_total
        for _ in range(3):
            src.poll(time.time())
        assert src.reads_total - before < 20  # of 300 sleeps and the box's processes
        assert len(src.current()["api"].pids) == 3  # the server's own processes are still read
    finally:
        for p in sleeps:
            p.kill()
            p.wait()


def test_a_server_tied_by_its_api_url_that_restarts_between_scans_is_restarted(sglang_install, sglang_procs):
    """Once every configured server runs a scan lists /proc only every LIST_EVERY; a server that
    exits and starts again between two scans is missing from the scan, which then lists /proc
    and finds the new launcher: restarted, not down."""
    from specwatch.config import ProcessTies

    port = free_port()
    first = sglang_procs.start(server_argv(sglang_install, port))
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=5, ties=ProcessTies({}, {port: "api"}, frozenset({"api"})))
    src.poll(time.time())
    src.poll(time.time())
    stop(first)
    second = sglang_procs.start(server_argv(sglang_install, port))
    rec.clear()
    src.poll(time.time())
    assert [(r.old.pid, r.new.pid) for r in rec.of(ServerRestarted)] == [(first.pid, second.pid)]
    assert rec.of(ServerDown) == [] and src.current()["api"].pid == second.pid


def test_a_server_whose_pid_goes_to_another_process_is_down_not_restarted(sglang_install, sglang_procs):
    """The launcher exits and its pid is handed to an unrelated process before the next scan (the
    pid cursor came round): its start time changed, so it is read again, and the server is down,
    not restarted as `sleep`."""
    port = free_port()
    launcher = sglang_procs.start(server_argv(sglang_install, port))
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=5, servers={port: "s"})
    src.poll(time.time())
    src.poll(time.time())
    pid = launcher.pid
    assert pid in src.pids()
    kids = psutil.Process(pid).children()
    stop(launcher)
    psutil.wait_procs(kids, timeout=10)  # the pid is free once no process of its session is left
    other = popen_at(pid, lambda: popen(["sleep", "60"]))
    if other is None:
        pytest.skip("cannot hand a chosen pid to a new process here (ns_last_pid needs root)")
    try:
        rec.clear()
        src.poll(time.time())
        assert [d.last.pid for d in rec.of(ServerDown)] == [pid]
        assert rec.of(ServerRestarted) == [] and pid not in src.pids()
    finally:
        other.kill()
        other.wait()


def test_a_pid_handed_out_again_between_two_listings_is_read_again(sglang_install, sglang_procs, monkeypatch):
    """A listing reads the processes that are new since the last one: pids it has not seen, and
    pids it knew that were handed out again since (the process under the number exited and a new
    one got it). A launcher started under the pid of a `sleep` read before is found."""
    from specwatch.config import ProcessTies

    monkeypatch.setattr(process_mod, "LIST_EVERY", 0.0)  # every scan lists /proc
    tied, late = free_port(), free_port()
    sglang_procs.start(server_argv(sglang_install, tied))
    placeholder = popen(["sleep", "60"])
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    try:  # the pid cursor far past the sleep's pid, as after the box's forks of a while
        Path("/proc/sys/kernel/ns_last_pid").write_text(str((placeholder.pid + 5000) % pid_max))
    except OSError:
        pytest.skip("cannot move the pid cursor here (ns_last_pid needs root)")
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=5, ties=ProcessTies({}, {tied: "a"}, frozenset({"a"})))
    src.poll(time.time())
    src.poll(time.time())  # the sleep read (at the first scan) and read no more
    assert "a" in src.current()
    pid = placeholder.pid
    placeholder.kill()
    placeholder.wait()
    launcher = popen_at(pid, lambda: launch(server_argv(sglang_install, late)))
    if launcher is None:
        pytest.skip("cannot hand a chosen pid to a new process here (ns_last_pid needs root)")
    sglang_procs.started.append(launcher)
    wait_children(launcher)
    src.poll(time.time())
    assert src.current()[f"box:{late}"].pid == pid


def test_match_regex_adds_a_wrapper(tmp_path, sglang_procs):
    import venv
    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "plain")
    python = tmp_path / "plain" / "bin" / "python"
    script = tmp_path / "serve_llama.py"
    script.write_text("import time\ntime.sleep(3600)\n")
    port = free_port()
    p = sglang_procs.start([str(python), str(script), "--port", str(port), "--speculative-algorithm", "EAGLE3"],
                           children=0)
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=5, servers={port: "wrapped"}, match=r"serve_llama\.py")
    deadline = time.monotonic() + 5
    while not rec.of(ServerStarted):
        assert time.monotonic() < deadline
        src.poll(time.time())
    sp = rec.of(ServerStarted)[0].process
    assert sp.pid == p.pid and sp.args["speculative_algorithm"] == "EAGLE3"
    assert sp.interpreter == str(python)
    assert (sp.sglang_version, sp.sglang_location) == (None, None)  # that venv has no sglang


def test_thread_start_stop(sglang_install, sglang_procs):
    port = free_port()
    sglang_procs.start(server_argv(sglang_install, port))
    rec = Recorder()
    src = ProcessSource(rec, server="box", interval=0.05, servers={port: "s"})
    src.start()
    deadline = time.monotonic() + 5
    while len(rec.of(ProcessSample)) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert src.stop(timeout=2)
    assert src.scans_total >= 3 and src.scan_errors_total == 0


def test_usage_reads_what_psutil_reads_and_tells_a_reused_pid_by_its_start_time():
    """`_usage`'s two plain reads agree with psutil (start time, CPU, RSS) for a live process
    that burns CPU; a process's start time differs from another's, which is how the scan tells a
    pid reused (its cached command line is read again)."""
    p = popen([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass\nprint(flush=True)\ntime.sleep(60)"],
              stdout=subprocess.PIPE)
    try:
        p.stdout.readline()  # done burning CPU
        start, cpu, rss = process_mod._usage(p.pid)
        ps = psutil.Process(p.pid)
        t, mem = ps.cpu_times(), ps.memory_info().rss
        assert cpu == pytest.approx(t.user + t.system, abs=0.02) and cpu >= 0.29
        assert rss == mem
        assert ps.create_time() == pytest.approx(psutil.boot_time() + start / process_mod._TICKS, abs=0.02)
        assert process_mod._usage(1)[0] < start
    finally:
        p.kill()
        p.wait()
    assert process_mod._usage(p.pid) is None


def _samples(rec, server):
    return [e for s, e in rec.events if s == server and isinstance(e, ProcessSample)]


def test_a_log_written_through_tee_ties_its_server(sglang_install, sglang_procs, tmp_path):
    """The README's plain-file setup, `... 2>&1 | tee -a server.log`, through a real shell: the
    launcher's fd 1/2 is a pipe, `tee` holds the file. The server is still the log's (a
    configured server): killed, it is down; started again the same way, it is back, restarted."""
    from specwatch.config import ProcessTies, build_config

    log = tmp_path / "server.log"
    cfg = build_config({"server": "sglang-0", "logs": [{"path": str(log)}]})
    port = free_port()
    sh, pid = sglang_procs.start_teed(server_argv(sglang_install, port), log)
    assert all(t.startswith("pipe:[") for t in (os.readlink(f"/proc/{pid}/fd/{fd}") for fd in (1, 2)))
    rec = Recorder()
    src = ProcessSource(rec, server="sglang-0", interval=5, ties=ProcessTies.of(cfg))
    src.poll(time.time())
    assert [e.process.pid for e in rec.of(ServerStarted)] == [pid]
    assert [(e.process.pid, e.expected) for e in _samples(rec, "sglang-0")] == [(pid, True)]
    assert not any(s == f"sglang-0:{port}" for s, _ in rec.events)

    os.kill(pid, signal.SIGKILL)  # a crash: tee sees the end of its input and exits
    sh.wait(timeout=10)
    rec.clear()
    src.poll(time.time())
    assert [d.last.pid for d in rec.of(ServerDown)] == [pid]

    sh2, pid2 = sglang_procs.start_teed(server_argv(sglang_install, port, steps=3), log)
    rec.clear()
    src.poll(time.time())
    assert [(r.old.pid, r.new.pid) for r in rec.of(ServerRestarted)] == [(pid, pid2)]
    assert [(e.process.pid, e.expected) for e in _samples(rec, "sglang-0")] == [(pid2, True)]


def test_a_server_writing_elsewhere_is_tied_by_the_port_of_its_log_server_args(sglang_install, sglang_procs,
                                                                                 tmp_path):
    """No fd ties it (its output goes to /dev/null here; another user's fds cannot be read at
    all): the port of the log's own `server_args` line does, and keeps it tied for that process
    after the log's settings are cleared by its start."""
    from specwatch.config import ProcessTies, build_config

    log = tmp_path / "server.log"
    cfg = build_config({"server": "sglang-0", "logs": [{"path": str(log)}]})
    port = free_port()
    p = sglang_procs.start(server_argv(sglang_install, port))
    ports: dict[int, str] = {}
    rec = Recorder()
    src = ProcessSource(rec, server="sglang-0", interval=5, ties=ProcessTies.of(cfg), log_ports=lambda: dict(ports))
    src.poll(time.time())
    assert [(e.process.pid, e.expected) for e in _samples(rec, f"sglang-0:{port}")] == [(p.pid, False)]
    ports[port] = "sglang-0"  # the log's server_args line was read
    rec.clear()
    src.poll(time.time())
    assert [(e.process, e.expected) for e in _samples(rec, f"sglang-0:{port}")] == [(None, False)]
    assert [(e.process.pid, e.expected) for e in _samples(rec, "sglang-0")] == [(p.pid, True)]
    ports.clear()
    rec.clear()
    src.poll(time.time())
    assert [(e.process.pid, e.expected) for e in _samples(rec, "sglang-0")] == [(p.pid, True)]
    stop(p)
    rec.clear()
    src.poll(time.time())
    assert [d.last.pid for d in rec.of(ServerDown)] == [p.pid]
