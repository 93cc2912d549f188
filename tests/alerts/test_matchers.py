"""Alertmanager matcher syntax and the silences file."""

import json

import pytest

from specwatch.alerts.matchers import Matcher, parse_matcher
from specwatch.alerts.silences import SilenceStore

LABELS = {"alertname": "AcceptanceCollapse", "severity": "critical", "rank": "DP1 TP1"}


@pytest.mark.parametrize("text,hit", [
    ("alertname=AcceptanceCollapse", True),
    ('severity="critical"', True),
    ("severity!=critical", False),
    ('rank=~"DP[0-3] TP.*"', True),
    ("rank=~DP1", False),  # anchored, as in Alertmanager
    ("rank!~DP9.*", True),
    ("server=", True),  # absent label = empty value
    ('alertname="Acceptance\\"Collapse"', False),
])
def test_matchers(text, hit):
    assert parse_matcher(text).matches(LABELS) is hit


def test_round_trip_and_errors():
    m = parse_matcher('comment="say \\"hi\\""')
    assert m.value == 'say "hi"' and parse_matcher(str(m)) == m
    assert Matcher.from_dict(parse_matcher("a!~b").to_dict()) == parse_matcher("a!~b")
    for bad in ("noop", "=x", "a~b", "a=~("):
        with pytest.raises(ValueError):
            parse_matcher(bad)


def test_store_add_list_expire_and_reload(tmp_path):
    cli, daemon = SilenceStore(tmp_path), SilenceStore(tmp_path)
    assert daemon.reload_if_changed() is False and daemon.silences == []  # no file yet: nothing
    s = cli.add([parse_matcher("rank=DP1 TP1")], 100.0, 200.0, created_by="ops", comment="c")
    assert daemon.reload_if_changed() is True
    assert daemon.muted_by(LABELS, 150.0) == [s.id]
    assert daemon.muted_by(LABELS, 99.0) == [] and daemon.muted_by(LABELS, 200.0) == []
    assert daemon.reload_if_changed() is False  # unchanged file: no re-read
    pending = cli.add([parse_matcher("alertname=X")], 500.0, 600.0)
    cli.expire(pending.id, 300.0)  # a pending silence expired before it began
    daemon.reload_if_changed()
    assert {x.id: x.state(300.0) for x in daemon.silences} == {s.id: "expired", pending.id: "expired"}
    assert cli.list(301.0) == [] and len(cli.list(301.0, include_expired=True)) == 2
    with pytest.raises(ValueError):
        cli.expire(pending.id, 301.0)
    with pytest.raises(KeyError):
        cli.expire("", 1.0)
    doc = json.loads((tmp_path / "silences.json").read_text())
    assert doc["silences"][0]["matchers"] == ['rank="DP1 TP1"']


def test_broken_file_keeps_what_was_loaded(tmp_path):
    store = SilenceStore(tmp_path)
    store.add([parse_matcher("a=b")], 0, 10)
    store.reload_if_changed()
    (tmp_path / "silences.json").write_text('{"silences": [{"id": 1}]}')  # half-edited by hand
    store.reload_if_changed()
    assert len(store.silences) == 1 and store.muted_by({"a": "b"}, 5)


def test_store_refuses_silences_that_match_everything(tmp_path):
    with pytest.raises(ValueError):
        SilenceStore(tmp_path).add([parse_matcher('alertname=~".*"')], 0, 10)
    with pytest.raises(ValueError):
        SilenceStore(tmp_path).add([], 0, 10)


def test_files_written_by_the_cli_are_readable_by_the_daemon(tmp_path):
    import os
    import stat

    store = SilenceStore(tmp_path)
    store.add([parse_matcher("a=b")], 0, 10)
    for name in ("silences.json", "silences.lock"):
        st = os.stat(tmp_path / name)
        assert stat.S_IMODE(st.st_mode) == 0o600  # private (a comment may name what is), the daemon's own
        assert (st.st_uid, st.st_gid) == (os.stat(tmp_path).st_uid, os.stat(tmp_path).st_gid)
