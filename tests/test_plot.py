"""`specwatch replay --plot` (issue 12 item 2): the SVG's series and spans match the replay."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sglang_lines import decode_line, eight_rank_two_collapses_log, server_args_line, three_rank_collapse_log

pytest.importorskip("matplotlib")  # the `plot` extra; in the `test` extra, so CI has it

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"


def replay(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specwatch", "replay", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def vertices(root: ET.Element, gid: str) -> list[tuple[float, float]]:
    [g] = [e for e in root.iter(f"{SVG}g") if e.get("id") == gid]
    d = next(g.iter(f"{SVG}path")).get("d")
    return [(float(x), float(y)) for x, y in re.findall(r"[ML] ([-\d.]+) ([-\d.]+)", d)]


def test_plot_of_a_three_rank_episode_matches_the_summary(tmp_path):
    log, out = tmp_path / "three.log", tmp_path / "three.svg"
    three_rank_collapse_log(log)
    r = replay(str(log), "--plot", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["plot"]["ranks"] == {"DP0 TP0": 120, "DP1 TP1": 120, "DP2 TP2": 120}
    assert {k: v["decode_batches"] for k, v in doc["ranks"].items()} == doc["plot"]["ranks"]
    root = ET.parse(out).getroot()
    for rank in ("DP0_TP0", "DP1_TP1", "DP2_TP2"):
        assert len(vertices(root, f"accept-length-{rank}")) == 120
        assert len(vertices(root, f"throughput-{rank}")) == 120
    # the collapse episode's shading starts at DP1's 41st point (10:00:40), its lowest values
    [collapse] = [e for e in doc["episodes"] if e["name"] == "AcceptanceCollapse"]
    assert (collapse["rank"], collapse["starts_at"], collapse["status"]) == ("DP1 TP1", "2026-03-01T10:00:40Z", "resolved")
    names = [e["name"] for e in doc["episodes"]]
    span = vertices(root, f"episode-{names.index('AcceptanceCollapse')}")
    dp1 = vertices(root, "accept-length-DP1_TP1")
    left, right = min(x for x, _ in span), max(x for x, _ in span)
    assert left == pytest.approx(dp1[40][0], abs=0.01)
    ends = collapse["ends_at"]  # resolved at the min_batches-th healthy line after 10:01:19
    assert ends == "2026-03-01T10:01:22Z" and right == pytest.approx(dp1[82][0], abs=0.01)
    low = [y for x, y in dp1 if left - 0.01 <= x <= dp1[79][0] + 0.01]
    assert len(low) == 40 and len(set(low)) == 1  # 40 collapsed points, all at 1.02 (SVG y grows down)
    assert max(y for _, y in dp1) == low[0]
    # the restart at 10:01:40 is marked on both panels, at DP0's 101st point
    assert doc["plot"]["restarts"] == 1
    restart_x = vertices(root, "restart-0-0")[0][0]
    assert restart_x == pytest.approx(vertices(root, "accept-length-DP0_TP0")[100][0], abs=0.01)
    assert vertices(root, "restart-0-1")[0][0] == pytest.approx(restart_x, abs=0.01)
    threshold_y = vertices(root, "threshold")[0][1]
    assert all(y > threshold_y for y in low)  # below the threshold line


def test_plot_of_the_bundled_example_as_png(tmp_path):
    out = tmp_path / "kimi.png"
    r = replay("examples/logs/kimi-k25-eagle3-collapse.log", "--config", "examples/kimi-k25.yaml",
               "--plot", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["plot"]["ranks"] == {"TP0": 2} and len(doc["plot"]["episodes"]) == 1
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert "plot written to" in r.stderr


def box(root: ET.Element, gid: str) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of the SVG element `gid`'s paths (y grows down)."""
    [g] = [e for e in root.iter() if e.get("id") == gid]
    pts = [(float(x), float(y)) for p in g.iter(f"{SVG}path") for x, y in re.findall(r"[ML] ([-\d.]+) ([-\d.]+)", p.get("d"))]
    xs, ys = [x for x, _ in pts], [y for _, y in pts]
    return min(xs), min(ys), max(xs), max(ys)


def labels(root: ET.Element) -> dict[str, tuple[float, float]]:
    """Episode label text → (x, y) of its start (SVG text is kept as text)."""
    out = {}
    for g in root.iter(f"{SVG}g"):
        if re.fullmatch(r"episode-\d+-label", g.get("id") or ""):
            t = next(g.iter(f"{SVG}text"))
            out[t.text.strip()] = (float(t.get("x")), float(t.get("y")))
    return out


def test_overlapping_episodes_of_eight_ranks_are_labelled_apart_above_the_data(tmp_path):
    """8 ranks, DP3's and DP5's episodes overlap: each label sits in a lane of its own above the
    accept length panel (none on the data or the threshold), starts at its episode, and the
    legend is below the panels, not over the data."""
    log, out = tmp_path / "eight.log", tmp_path / "eight.svg"
    eight_rank_two_collapses_log(log)
    r = replay(str(log), "--plot", str(out), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert len(doc["plot"]["ranks"]) == 8
    root = ET.parse(out).getroot()
    left, top, right, bottom = box(root, "accept-length-axes")
    found = labels(root)
    want = {f"{e['name']} {e['rank']}" for e in doc["episodes"]}
    assert set(found) == want and {"AcceptanceCollapse DP3 TP3", "AcceptanceCollapse DP5 TP5"} <= want
    assert all(y < top for _, y in found.values())  # above the data panel
    assert len({y for _, y in found.values()}) == len(found)  # all four overlap in time: four lanes
    for i, e in enumerate(doc["episodes"]):  # each label starts where its shading starts
        assert found[f"{e['name']} {e['rank']}"][0] == pytest.approx(box(root, f"episode-{i}")[0], abs=1)
    legend = box(root, "legend")
    assert legend[1] > box(root, "throughput-axes")[3]  # below the lowest panel


def test_threshold_and_label_of_the_bundled_example_are_apart(tmp_path):
    """The example's threshold (1.10) is above all its points: it is drawn inside the panel, not
    on its frame, and the episode label is not on it."""
    out = tmp_path / "kimi.svg"
    r = replay("examples/logs/kimi-k25-eagle3-collapse.log", "--config", "examples/kimi-k25.yaml", "--plot", str(out))
    assert r.returncode == 0, r.stderr
    root = ET.parse(out).getroot()
    _, top, _, bottom = box(root, "accept-length-axes")
    threshold_y = vertices(root, "threshold")[0][1]
    assert top + 5 < threshold_y < bottom
    [(_, label_y)] = labels(root).values()
    assert label_y < top


def test_a_log_without_decode_lines_draws_only_a_message(tmp_path):
    """No decode lines: no axes (no 1970 time axis), a message saying why."""
    log, out = tmp_path / "start.log", tmp_path / "empty.svg"
    log.write_text(server_args_line(ts="2026-03-01 09:59:00", speculative_algorithm="EAGLE3")[0] + "\n")
    r = replay(str(log), "--plot", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plot"] == {"path": str(out), "ranks": {}, "episodes": [], "restarts": 0}
    svg = out.read_text()
    root = ET.fromstring(svg)
    [message] = [e for e in root.iter() if e.get("id") == "no-data"]
    assert "no decode lines under load" in "".join(message.itertext())
    assert "1970" not in svg and "log time" not in svg and not any(e.get("id", "").startswith("axes") for e in root.iter())


def test_plot_refuses_another_suffix_before_reading():
    r = replay("examples/logs/kimi-k25-eagle3-collapse.log", "--plot", "out.pdf")
    assert r.returncode == 2 and "give a file ending in .svg or .png" in r.stderr


def test_plot_into_a_missing_or_unusable_folder_is_refused_before_reading(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "dir.png").mkdir()
    for out, says in ((tmp_path / "no" / "such" / "x.png", f"the folder {tmp_path / 'no' / 'such'} does not exist"),
                      (tmp_path / "notes.txt" / "x.png", f"the folder {tmp_path / 'notes.txt'} is not a folder"),
                      (tmp_path / "dir.png", "is a folder")):
        r = replay("examples/logs/kimi-k25-eagle3-collapse.log", "--plot", str(out))
        assert (r.returncode, r.stdout) == (2, ""), r.stderr
        assert says in r.stderr and "Traceback" not in r.stderr


def test_a_plot_that_cannot_be_written_keeps_the_report(tmp_path):
    """The folder is fine but the write fails (a full disk: a link to /dev/full): the report
    is printed first, the error is one line, the exit status 1; with --json the report says why."""
    out = tmp_path / "full.png"
    out.symlink_to("/dev/full")
    r = replay("examples/logs/kimi-k25-eagle3-collapse.log", "--config", "examples/kimi-k25.yaml", "--plot", str(out))
    assert r.returncode == 1
    assert "AcceptanceCollapse" in r.stdout and r.stdout.startswith("lines: ")
    [err] = [ln for ln in r.stderr.splitlines() if "--plot" in ln]
    assert err.startswith(f"specwatch replay: --plot {out}: could not draw the plot (OSError: ") and "Traceback" not in r.stderr
    r = replay("examples/logs/kimi-k25-eagle3-collapse.log", "--config", "examples/kimi-k25.yaml", "--plot", str(out), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["alerts"][0]["name"] == "AcceptanceCollapse"
    assert doc["plot"]["path"] == str(out) and doc["plot"]["error"].startswith("OSError: ")


def test_without_matplotlib_the_error_names_the_extra(tmp_path):
    """As on an install without the `plot` extra: matplotlib cannot be imported."""
    block = ("import sys\n"
             "class NoMatplotlib:\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] == 'matplotlib':\n"
             "            raise ImportError('No module named matplotlib')\n"
             "sys.meta_path.insert(0, NoMatplotlib())\n"
             "from specwatch.cli import main\n"
             "sys.exit(main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", block, "replay", "examples/logs/kimi-k25-eagle3-collapse.log",
                        "--plot", str(tmp_path / "x.svg")], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 2
    assert ("--plot needs matplotlib, which is not installed: pip install 'specwatch[plot]' "
            "(from a checkout: pip install '.[plot]')") in r.stderr
    assert not (tmp_path / "x.svg").exists()


def test_collapse_message_carries_the_ranks_trend(tmp_path):
    """End to end: the collapse alert of DP1 (fires at 10:00:42, its 3rd line at 1.02; the other
    ranks healthy, so the one message is its RankDisagreement, which mutes its AcceptanceCollapse)
    carries DP1's 10 s means since 10:00:00 (5 points), the mean since the last point and
    the firing line's 1.02, drawn as a sparkline that ends at the floor, and the server's
    lowest/highest rank."""
    import re

    log = tmp_path / "three.log"
    three_rank_collapse_log(log)
    doc = json.loads(replay(str(log), "--slack-dry-run", "--json").stdout)
    [payload] = [p for p in doc["slack_payloads"] if p["text"].startswith("[FIRING] RankDisagreement")]
    assert not [p for p in doc["slack_payloads"] if "AcceptanceCollapse" in p["text"]]
    [trend] = [b["text"]["text"] for b in payload["blocks"]
               if b["type"] == "section" and "text" in b and b["text"]["text"].startswith("*accept len, recent trend*")]
    title, spark, ranks = trend.split("\n")
    bars, first, arrow, last = spark.split(" ")
    assert len(bars) == 2 + 7 and bars[-2] == "▁" and bars[1] == "█" and (arrow, last) == ("→", "1.02")
    assert 2.3 <= float(first) <= 2.9  # DP1's healthy accept length before the collapse
    assert re.fullmatch(r"lowest DP1 TP1 1\.02, highest DP[02] TP[02] 2\.\d\d", ranks)
    [firing] = [a for a in doc["alerts"] if a["name"] == "AcceptanceCollapse" and a["status"] == "firing"]
    assert firing["starts_at"] == "2026-03-01T10:00:40Z"


def test_trend_ends_at_the_accept_length_that_fired(tmp_path):
    """New-user trial: 7 lines at 2.9 then 3 at 1.0, one a second. The 10 s mean since the first
    point still holds the healthy lines (2.27); the trend must not end there, above the message's
    own `accept len: 1.00`, but at the firing line's value."""
    log = tmp_path / "drop.log"
    log.write_text("".join(decode_line("0.5.23", ts=f"2026-01-01 12:00:{i:02d}", accept_len=2.9 if i < 7 else 1.0)[0]
                           + "\n" for i in range(10)))
    r = replay(str(log), "--slack-dry-run")
    assert r.returncode == 0, r.stderr
    message = r.stdout.split("\nlines: ", 1)[0]
    assert "accept len: 1.00" in message
    spark = message.split("*accept len, recent trend*\n", 1)[1].splitlines()[0]
    bars, first, arrow, last = spark.split(" ")
    assert (first, arrow, last) == ("2.90", "→", "1.00") and bars[-2] == "▁"
