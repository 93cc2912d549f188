"""Two keys of a rule that must stay apart: a default the user did not write gives way to the key
the user wrote (as Prometheus' scrape_timeout = min(its default, the interval)); only two written
keys that conflict are refused, by `check-config` with exit 2, naming both and the fix."""

import pytest
import yaml

from specwatch import cli
from specwatch.config import ConfigError, build_config

from timeline import Timeline, names, run


def rules(section: str, **keys):
    """The effective `rules.<section>` of a config that writes only `keys` there."""
    cfg = build_config({"rules": {section: keys}})
    return getattr(cfg, "server_rule" if section == "server" else section)


def check_config(tmp_path, capsys, section: str, **keys) -> tuple[int, list[str]]:
    """`specwatch check-config` on a file writing `keys` in `rules.<section>`: (exit code, the
    problem lines)."""
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump({"logs": [str(tmp_path / "server.log")], "state_dir": str(tmp_path / "state"),
                                 "rules": {section: keys}}))
    rc = cli.main(["check-config", str(f)])
    err = capsys.readouterr().err
    return rc, [line.strip() for line in err.splitlines() if line.startswith("  rules.")]


def test_a_collapse_threshold_written_alone_moves_the_other():
    c = rules("collapse", max_accept_length=1.6)  # refused before: the unwritten recover (1.5) was below it
    assert (c.max_accept_length, c.recover_accept_length) == (1.6, 2.0)  # the defaults' distance, 0.4
    c = rules("collapse", recover_accept_length=1.3)
    assert (c.max_accept_length, c.recover_accept_length) == (1.1, 1.3)  # a default that fits stays
    c = rules("collapse", recover_accept_length=1.05)
    assert (c.max_accept_length, c.recover_accept_length) == (1.0, 1.05)  # 1.05 - 0.4, held at the floor 1.0
    assert rules("collapse", max_accept_length=1.3).recover_accept_length == 1.5
    # the rule decides with the moved value: 1.8 is no recovery from a collapse at 1.6, 2.1 is
    config = {"rules": {"collapse": {"max_accept_length": 1.6}}}
    log = Timeline().decode(n=4, accept=2.8).decode(n=3, accept=1.5).decode(n=3, accept=1.8)
    assert [x[:2] for x in names(run(log.lines, config))] == [("AcceptanceCollapse", "firing")]
    log.decode(n=3, accept=2.1)
    assert [x[:2] for x in names(run(log.lines, config))] == [("AcceptanceCollapse", "firing"),
                                                               ("AcceptanceCollapse", "resolved")]

def test_collapse_thresholds_both_written_and_crossed_are_refused(tmp_path, capsys):
    rc, ps = check_config(tmp_path, capsys, "collapse", max_accept_length=1.6, recover_accept_length=1.5)
    assert rc == 2
    assert ps == ["rules.collapse.recover_accept_length: must be above max_accept_length (1.6) or the alert would "
                  "flap; leave it out (it then follows max_accept_length) or write e.g. 2.0"]


def test_a_threshold_no_value_of_its_range_can_follow_is_refused_at_the_written_key():
    with pytest.raises(ConfigError) as e:
        rules("collapse", max_accept_length=100)
    assert e.value.problems == [
        "rules.collapse.max_accept_length: 100 leaves no value for recover_accept_length (not written: it follows "
        "max_accept_length, but its range has no value above 100); change max_accept_length, or write both"]
    with pytest.raises(ConfigError) as e:
        rules("acceptance_ceiling", ratio=0.0)
    assert [p.split(": ")[0] for p in e.value.problems] == ["rules.acceptance_ceiling.ratio"] * 2
    assert "no value for recover_ratio" in e.value.problems[0] and "no value for max_steady_ratio" in e.value.problems[1]


def test_a_rank_disagreement_threshold_written_alone_moves_the_other():
    r = rules("rank_disagreement", max_accept_length=1.6)
    assert (r.max_accept_length, r.healthy_accept_length) == (1.6, 2.0)
    r = rules("rank_disagreement", healthy_accept_length=1.05)
    assert (r.max_accept_length, r.healthy_accept_length) == (1.0, 1.05)
    assert rules("rank_disagreement", healthy_accept_length=1.25).max_accept_length == 1.1


def test_rank_disagreement_thresholds_both_written_and_crossed_are_refused(tmp_path, capsys):
    rc, ps = check_config(tmp_path, capsys, "rank_disagreement", max_accept_length=1.6, healthy_accept_length=1.5)
    assert rc == 2
    # the example is above the written max_accept_length (it said 1.5, below it)
    assert ps == ["rules.rank_disagreement.healthy_accept_length: must be above max_accept_length (1.6); leave it "
                  "out (it then follows max_accept_length) or write e.g. 2.0"]


@pytest.mark.parametrize("section, max_drop, recover_drop, followed", [("degradation", 0.2, 0.1, 0.4),
                                                                       ("throughput_drop", 0.4, 0.2, 0.7)])
def test_a_drop_ratio_written_alone_moves_the_other(section, max_drop, recover_drop, followed):
    d = rules(section, max_drop_ratio=recover_drop)  # refused before: the default recover was not below it
    assert (d.max_drop_ratio, d.recover_drop_ratio) == (recover_drop, recover_drop / 2)
    d = rules(section, recover_drop_ratio=max_drop)  # twice it, at most halfway to 1: 0.2 -> 0.4, 0.4 -> 0.7
    assert (d.max_drop_ratio, d.recover_drop_ratio) == (followed, max_drop)
    d = rules(section, recover_drop_ratio=0.6)  # twice is 1.2: halfway to 1 instead (a drop of 1 never fires)
    assert (d.max_drop_ratio, d.recover_drop_ratio) == (0.8, 0.6)
    d = rules(section, max_drop_ratio=max_drop * 0.9)
    assert (d.max_drop_ratio, d.recover_drop_ratio) == (max_drop * 0.9, recover_drop)  # a default that fits stays


@pytest.mark.parametrize("section", ["degradation", "throughput_drop"])
def test_drop_ratios_both_written_and_crossed_are_refused(tmp_path, capsys, section):
    rc, ps = check_config(tmp_path, capsys, section, max_drop_ratio=0.1, recover_drop_ratio=0.2)
    assert rc == 2
    assert ps == [f"rules.{section}.recover_drop_ratio: must be below max_drop_ratio (0.1) or the alert would flap; "
                  "leave it out (it then follows max_drop_ratio) or write e.g. 0.05"]


def test_a_ceiling_ratio_written_alone_moves_the_others():
    a = rules("acceptance_ceiling", ratio=0.8)
    assert (a.ratio, a.recover_ratio, a.max_steady_ratio) == (0.8, 0.75, 0.7)
    a = rules("acceptance_ceiling", recover_ratio=0.97)
    assert (a.ratio, a.recover_ratio, a.max_steady_ratio) == (1.0, 0.97, 0.85)  # 1.02, held at 1
    a = rules("acceptance_ceiling", max_steady_ratio=0.95)
    assert (a.ratio, a.recover_ratio, a.max_steady_ratio) == (1.0, 0.9, 0.95)
    a = rules("acceptance_ceiling", ratio=0.92)
    assert (a.ratio, a.recover_ratio, a.max_steady_ratio) == (0.92, 0.9, 0.85)


def test_ceiling_ratios_written_and_crossed_are_refused(tmp_path, capsys):
    rc, ps = check_config(tmp_path, capsys, "acceptance_ceiling", ratio=0.8, recover_ratio=0.9, max_steady_ratio=0.85)
    assert rc == 2
    assert ps == [  # the examples follow the written ratio (they said 0.90 and 0.85 whatever it was)
        "rules.acceptance_ceiling.recover_ratio: must be below ratio (0.8) or the alert would flap; leave it out "
        "(it then follows ratio) or write e.g. 0.75",
        "rules.acceptance_ceiling.max_steady_ratio: must be below ratio (0.8): a step up needs a lower level before "
        "it; leave it out (it then follows ratio) or write e.g. 0.7"]


def test_a_drift_window_or_bucket_written_alone_moves_the_others():
    d = rules("drift", window="30m")  # refused before: 6 default buckets of 10m do not fit
    assert (d.window, d.bucket, d.min_buckets) == (1800, 300, 6)
    d = rules("drift", bucket="1h")
    assert (d.window, d.bucket, d.min_buckets) == (6 * 3600, 3600, 6)
    d = rules("drift", min_buckets=30)
    assert (d.window, d.bucket, d.min_buckets) == (30 * 600, 600, 30)
    d = rules("drift", window="30m", bucket="10m")
    assert (d.window, d.bucket, d.min_buckets) == (1800, 600, 3)
    d = rules("drift", window="30m", min_buckets=10)
    assert (d.window, d.bucket, d.min_buckets) == (1800, 180, 10)
    d = rules("drift", window="2h")
    assert (d.window, d.bucket, d.min_buckets) == (7200, 600, 6)  # defaults that fit stay


def test_drift_keys_written_and_crossed_are_refused(tmp_path, capsys):
    rc, ps = check_config(tmp_path, capsys, "drift", window="1h", bucket="20m", min_buckets=6)
    assert rc == 2
    assert ps == ["rules.drift.window: must hold min_buckets (6) buckets of bucket (1200s); make it at least 7200s, "
                  "or bucket at most 600s"]
    # min_buckets left out cannot follow (20m holds 2 buckets of 10m, the least is 3): window and bucket conflict
    rc, ps = check_config(tmp_path, capsys, "drift", window="20m", bucket="10m")
    assert rc == 2
    assert [p.split(": ")[0] for p in ps] == ["rules.drift.window"] and "bucket at most 200s" in ps[0]
