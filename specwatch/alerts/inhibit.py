"""Inhibition: a firing alert mutes other alerts that it explains (Alertmanager semantics).

A rule mutes a target alert when the target matches `target`, some firing alert other than the
target itself matches `source`, and both have the same value (absent = "") for every label in
`equal`. The defaults: an acceptance collapse mutes the throughput-drop and degradation alerts of
the same server and rank, and a degradation or a GPU throttling drop mutes the throughput drop,
because those alerts name the cause and carry the fix; a down server mutes the
`SpecwatchSourceDown` of its HTTP API and /metrics (it cannot answer). A rank disagreement mutes
the collapse alert of the same rank: a collapse of some ranks only is that disagreement, and its
message (the draft checkpoint, shared by the healthy ranks, is not the problem) is the one
diagnosis sent, not a second message leading with checkpoint checks. A collapse mutes the
draft-too-long alert of its server: once (almost) nothing is accepted, a long draft is not the
fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specwatch.alerts.matchers import Matcher, matches_all, parse_matcher
from specwatch.alerts.model import FIRING, Alert


@dataclass(frozen=True)
class InhibitRule:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...] = field(default_factory=tuple)

    def mutes(self, target: Alert, source: Alert) -> bool:
        return (  # cheapest tests first: this runs for every pair of alerts on every flush
            source is not target
            and source.status == FIRING
            and all(source.labels.get(k, "") == target.labels.get(k, "") for k in self.equal)
            and matches_all(self.target, target.labels)
            and matches_all(self.source, source.labels)
            and source.fingerprint != target.fingerprint
        )


def default_inhibit_rules() -> list[InhibitRule]:
    return [
        InhibitRule(source=(parse_matcher("alertname=AcceptanceCollapse"),),
                    target=(parse_matcher('alertname=~"ThroughputDrop|AcceptanceDegradation"'),),
                    equal=("server", "rank")),
        InhibitRule(source=(parse_matcher('alertname=~"AcceptanceDegradation|GpuThrottlingThroughputDrop"'),),
                    target=(parse_matcher("alertname=ThroughputDrop"),),
                    equal=("server", "rank")),
        InhibitRule(source=(parse_matcher("alertname=RankDisagreement"),),
                    target=(parse_matcher("alertname=AcceptanceCollapse"),),
                    equal=("server", "rank")),
        InhibitRule(source=(parse_matcher("alertname=AcceptanceCollapse"),),
                    target=(parse_matcher("alertname=DraftTooLong"),),
                    equal=("server",)),
        # a server that is down does not answer its HTTP API (rules/source_down.py)
        InhibitRule(source=(parse_matcher("alertname=ServerDown"),),
                    target=(parse_matcher("alertname=SpecwatchSourceDown"),
                            parse_matcher('source_kind=~"server_api|server_metrics"')),
                    equal=("server",)),
    ]


def inhibited(alert: Alert, rules: list[InhibitRule], alerts: list[Alert]) -> bool:
    """True when a firing alert in `alerts` mutes `alert` under one of `rules`."""
    return any(r.mutes(alert, src) for r in rules if matches_all(r.target, alert.labels) for src in alerts)
