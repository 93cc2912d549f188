"""Docker json-file and Kubernetes CRI logs: envelopes unwrapped, partial records joined, rotations
followed without loss, globs and server templates (issue 11 items 2, 3)."""

from __future__ import annotations

import difflib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from container_writer import SPLIT, expected_lines, records
from procs import popen
from specwatch.config import LogSource
from specwatch.sources.container import CRI, DOCKER, PLAIN, Unwrap, detect, names
from specwatch.sources.filestream import Follower, LineBatch
from specwatch.sources.logfiles import LogSet, matches, resolve, stage

WRITER = Path(__file__).resolve().parents[1] / "container_writer.py"


def batch(text: str, path: str = "f") -> LineBatch:
    return LineBatch(path, 0, len(text.encode()), block=text.encode(), text=text)


def unwrap_all(texts: list[str], envelope: str = "auto") -> tuple[list[str], Unwrap]:
    got: list[str] = []
    u = Unwrap(lambda b: got.extend(b.lines), envelope)
    for t in texts:
        u(batch(t))
    return got, u


def test_detect_each_envelope_from_a_first_line():
    assert detect('{"log":"hi\\n","stream":"stderr","time":"2026-11-30T10:00:00.1Z"}') == DOCKER
    assert detect('{"stream":"stdout","time":"2026-11-30T10:00:00Z"}') == DOCKER  # `log` omitted when empty
    assert detect("2026-11-30T10:00:00.123456789Z stderr F [2026-11-30 10:00:00] x") == CRI
    assert detect("2026-11-30T10:00:00.123456789+01:00 stdout P:x part") == CRI
    assert detect("[2026-11-30 10:00:00 TP0] Decode batch, #running-req: 1") == PLAIN
    assert detect('{"timestamp": "2026-01-01", "event": "request.finished"}') == PLAIN  # JSON request log
    assert detect("2026-11-30 10:00:00 INFO 1 [x.py:1] hi") == PLAIN


def test_docker_records_joined_per_stream_across_reads():
    recs = [json.dumps({"log": "A1-", "stream": "stderr", "time": "t"}),
            json.dumps({"log": "out\r\n", "stream": "stdout", "time": "t"}),
            json.dumps({"log": "A2-", "stream": "stderr", "time": "t"}),
            json.dumps({"stream": "stdout", "time": "t"}),  # empty `log`: no text, line continues
            json.dumps({"log": "A3\n", "stream": "stderr", "time": "t"}),
            "not json at all"]
    got, u = unwrap_all([recs[0] + "\n" + recs[1] + "\n", recs[2] + "\n" + recs[3] + "\n",
                         recs[4] + "\n" + recs[5] + "\n"])
    assert got == ["out", "A1-A2-A3", "not json at all"]
    assert (u.envelope, u.records_total, u.bad_records_total) == (DOCKER, 6, 1)


def test_cri_partials_joined_per_stream_and_offsets_kept():
    text = ("2026-11-30T10:00:00.1Z stderr P ab\n"
            "2026-11-30T10:00:00.2Z stdout F x\n"
            "2026-11-30T10:00:00.3Z stderr P c d\n"
            "2026-11-30T10:00:00.4Z stderr F e\n"
            "2026-11-30T10:00:00.5Z stderr F\n")
    seen: list[LineBatch] = []
    u = Unwrap(seen.append)
    u(batch(text))
    assert seen[0].lines == ["x", "abc de", ""]
    starts = [text.index("stdout F x") - 23, 0, text.index("2026-11-30T10:00:00.5Z")]
    assert seen[0].offsets() == starts


def test_partial_over_max_line_bytes_is_dropped_and_counted():
    recs = "".join(records("cri", "y" * (SPLIT * 5), 0)) + "".join(records("cri", "short", 1))
    got: list[str] = []
    u = Unwrap(lambda b: got.extend(b.lines), max_line_bytes=SPLIT * 2)
    u(batch(recs))
    assert got == ["short"] and u.long_lines_skipped_total == 1


def test_a_followed_container_logs_dropped_lines_and_bad_records_are_in_metrics(tmp_path):
    """What Unwrap drops (a rejoined line over follow.max_line_bytes) and passes on as it is (a
    record that is not CRI) shows in the file's counters, as a plain file's long line does."""
    from prometheus_client import CollectorRegistry

    from specwatch.core.metrics import FollowerCollector

    p = tmp_path / "0.log"
    p.write_text("".join(records("cri", "first", 0)) + "".join(records("cri", "y" * (SPLIT * 5), 1))
                 + "not a CRI record\n" + "".join(records("cri", "last", 2)))
    got: list[str] = []
    f = Follower(p, on_lines=stage(LogSource(path=str(p), server="pod"), lambda b: got.extend(b.lines), SPLIT * 2))
    f.poll()
    assert got == ["first", "not a CRI record", "last"]
    registry = CollectorRegistry()
    registry.register(FollowerCollector(lambda: {str(p): f}))
    assert registry.get_sample_value("specwatch_log_long_lines_skipped_total", {"path": str(p)}) == 1
    assert registry.get_sample_value("specwatch_log_bad_envelope_records_total", {"path": str(p)}) == 1


def test_plain_file_batches_pass_through_untouched():
    seen: list[LineBatch] = []
    u = Unwrap(seen.append)
    b = batch("[2026-11-30 10:00:00] hello\nworld\n")
    u(b)
    assert seen == [b] and u.envelope == PLAIN
    assert stage(LogSource("f", "s", envelope="plain"), seen.append) == seen.append  # format: sglang


def follow_writer(tmp_path: Path, fmt: str, mode: str, n: int, path: Path,
                  pause: float = 0.003) -> tuple[list[str], Follower, int]:
    """Follow `path` (polling every `pause` s) while a real writer process writes `n` lines."""
    got: list[str] = []
    f = Follower(path, on_lines=stage(LogSource(str(path), "s"), lambda b: got.extend(b.lines)),
                 read_chunk_bytes=4096)
    path.touch()  # the runtime creates the file before the container writes
    f.poll()
    proc = popen([sys.executable, str(WRITER), fmt, str(path), str(n), "20000", mode],
                 stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None:
            assert time.monotonic() < deadline, f"the writer still runs after 60 s; read {len(got)} of {n} lines"
            f.poll()
            time.sleep(pause)
        assert proc.returncode == 0
        rotations = int(proc.stdout.read())
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    for _ in range(3):
        f.poll()
    return got, f, rotations


def line_diff(got: list[str], want: list[str]) -> str:
    """The lines that differ, as a short unified diff (got vs expected)."""
    def short(d: str) -> str:  # a long line: its length, start and end (where a cut shows)
        return d if len(d) <= 120 else f"{d[:70]}...{d[-40:]} ({len(d) - 1} chars)"
    return "lines read differ from those written:\n" + "\n".join(
        short(d) for d in difflib.unified_diff(want, got, "expected", "got", n=1, lineterm=""))


@pytest.mark.parametrize("fmt,mode,pause", [("docker", "rename", 0.003), ("docker", "gzip", 0.003),
                                            ("docker", "gzip", 0.2), ("docker", "copy", 0.003),
                                            ("cri", "kubelet", 0.003), ("cri", "kubelet", 0.2),
                                            ("cri", "rename", 0.003)])
def test_real_writer_with_partials_and_rotations_loses_and_repeats_nothing(tmp_path, fmt, mode, pause):
    """A slow reader (`pause` 0.2 s) finds several rotations at once: the rest of its file and the
    files after it are read from the rotated copies, gzipped ones too."""
    n = 600
    if fmt == "docker":
        d = tmp_path / "containers" / ("ab" * 32)
        d.mkdir(parents=True)
        path = d / (d.name + "-json.log")
    else:
        d = tmp_path / "pods" / "default_sglang-0_1234" / "sglang"
        d.mkdir(parents=True)
        path = d / "0.log"
    got, f, rotations = follow_writer(tmp_path, fmt, mode, n, path, pause)
    assert rotations >= 5  # the writer did rotate, also in the middle of cut lines
    want = expected_lines(n)
    assert got == want, line_diff(got, want)
    assert f.rotated_files_lost_total == 0
    if pause > 0.1:  # the slow reader found its file and the later ones among the rotated copies
        assert f.recovered_lines_total > 0


def test_names_of_docker_and_cri_files(tmp_path):
    cid = "0123456789ab" + "c" * 52
    d = tmp_path / "containers" / cid
    d.mkdir(parents=True)
    log = str(d / f"{cid}-json.log")
    assert names(log) == {"file": f"{cid}-json.log", "id": cid[:12], "container": cid[:12]}
    (d / "config.v2.json").write_text(json.dumps({"ID": cid, "Name": "/sglang-a",
                                                  "Config": {"Image": "lmsysorg/sglang:v0.5.23"}}))
    assert names(log)["container"] == "sglang-a" and names(log)["image"] == "lmsysorg/sglang:v0.5.23"
    (d / "config.v2.json").write_text(json.dumps({"ID": cid, "Name": "", "Config": {"Image": "img"}}))
    assert names(log)["container"] == "img"
    pod = "/var/log/pods/llm_sglang-7f9c_0f0e/sglang/0.log"
    assert names(pod) == {"file": "0.log", "namespace": "llm", "pod": "sglang-7f9c", "uid": "0f0e",
                          "container": "sglang"}
    assert resolve(LogSource(pod, "{namespace}/{pod}"), pod).server == "llm/sglang-7f9c"
    assert resolve(LogSource("/x/server.log", "{pod}"), "/x/server.log").server == "server.log"


def test_glob_leaves_out_rotated_compressed_and_temporary_files(tmp_path):
    d = tmp_path / "ns_pod_uid" / "c"
    d.mkdir(parents=True)
    for name in ("0.log", "1.log", "0.log.20261130-100000", "0.log.20261130-090000.gz",
                 "0.log.20261130-080000.tmp", "x-json.log", "x-json.log.1"):
        (d / name).write_text("a\n")
    assert matches(str(tmp_path / "*" / "*" / "*")) == [str(d / n) for n in ("0.log", "1.log", "x-json.log")]
    (d / "0.log").unlink()  # mid-rotation: the live name is briefly absent
    assert matches(str(d / "*"), known={str(d / "0.log")}) == [str(d / n) for n in ("1.log", "x-json.log")]


def test_logset_picks_up_pods_that_appear_and_drops_deleted_ones(tmp_path):
    pattern = str(tmp_path / "pods" / "*" / "*" / "*.log")
    ls = LogSet([LogSource(pattern, "{pod}"), LogSource(str(tmp_path / "plain.log"), "box")])
    assert ls.patterns
    assert [(s.path, s.server) for s in ls.scan()] == [(str(tmp_path / "plain.log"), "box")]
    a = tmp_path / "pods" / "llm_sglang-a_1" / "sglang"
    a.mkdir(parents=True)
    (a / "0.log").write_text("")
    assert [s.server for s in ls.scan()] == ["sglang-a", "box"]
    (a / "0.log").rename(a / "0.log.20261130-100000")  # rotation in progress: still followed
    assert sorted(s.server for s in ls.scan()) == ["box", "sglang-a"]
    (a / "0.log.20261130-100000").unlink()
    a.rmdir()
    a.parent.rmdir()  # the pod is deleted
    assert [s.server for s in ls.scan()] == ["box"]


def test_logset_drops_a_deleted_file_of_a_pod_that_stays_after_the_grace(tmp_path, monkeypatch):
    """The container restarted: kubelet writes 1.log and deletes 0.log from the same pod
    directory. 0.log is kept through a rotation's gap, then dropped (a reviewer found it followed,
    and warned about, for good)."""
    from specwatch.sources import logfiles

    c = tmp_path / "pods" / "llm_sglang-a_1" / "sglang"
    c.mkdir(parents=True)
    (c / "0.log").write_text("")
    ls = LogSet([LogSource(str(tmp_path / "pods" / "*" / "*" / "*.log"), "{pod}")])
    assert [s.path for s in ls.scan()] == [str(c / "0.log")]
    (c / "1.log").write_text("")
    (c / "0.log").unlink()
    assert [s.path for s in ls.scan()] == [str(c / "1.log"), str(c / "0.log")]  # within the grace
    monkeypatch.setattr(logfiles, "ABSENT_GRACE", 0.0)
    assert [s.path for s in ls.scan()] == [str(c / "1.log")]  # past it: dropped
    assert [s.path for s in ls.scan()] == [str(c / "1.log")] and ls._absent == {}
