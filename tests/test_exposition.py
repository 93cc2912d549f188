"""specwatch/system/exposition.py writes, byte for byte, what prometheus-client's own encoders write for
the same registry (text 0.0.4, text 1.0.0, OpenMetrics), from its cache too: unchanged families,
families whose values moved, series that came and went, label values that need escaping."""

from __future__ import annotations

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    Summary,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from specwatch.system.exposition import Exposition

ACCEPTS = ("", "text/plain;version=1.0.0",
           ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
            "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"))


class Moving(Collector):
    """Families built at each collect, as specwatch's collectors do, from `value` and `ranks`."""

    value = 0.0
    ranks = ("DP0 TP0", "DP1 TP1")

    def collect(self):
        g = GaugeMetricFamily("sw_accept_length", 'Accept "length" \\ of a rank\nper round.', labels=["server", "rank"])
        for r in self.ranks:
            g.add_metric(["box", r], self.value)
        g.add_metric(["box", 'odd "rank" \\ with\nnewline ünï'], float("nan"))
        yield g
        yield CounterMetricFamily("sw_lines", "Lines.", value=self.value * 3)
        yield GaugeMetricFamily("sw_nothing", "No series.", labels=["a"])
        yield GaugeMetricFamily("sw_unit_seconds", "With a unit.", value=1e22, unit="seconds")


@pytest.fixture
def registry():
    r = CollectorRegistry()
    g = Gauge("lib_gauge", "A gauge.", ["a"], registry=r)
    g.labels("x").set(1.5)
    Counter("lib_counter", "A counter with _created.", ["k"], registry=r).labels("v").inc(3)
    Histogram("lib_histogram", "A histogram.", registry=r).observe(0.3)
    Summary("lib_summary", "A summary.", registry=r).observe(2)
    Info("lib", "An info.", registry=r).info({"version": "1"})
    r.register(Moving())
    return r


@pytest.mark.parametrize("accept", ACCEPTS)
def test_same_bytes_as_the_library(registry, accept):
    moving = next(c for c in registry._collector_to_names if isinstance(c, Moving))
    e = Exposition(registry)
    encoder, content_type = choose_encoder(accept)
    for value, ranks in ((0.0, Moving.ranks), (2.25, Moving.ranks), (2.25, Moving.ranks), (float("inf"), ("DP0 TP0",)),
                         (123456789.0, ("DP0 TP0", "DP2 TP2", "DP1 TP1")), (-0.5, ())):
        moving.value, moving.ranks = value, ranks
        body, got_type = e.render(accept)
        assert got_type == content_type
        assert body == encoder(registry), (value, ranks)
    assert b'rank="odd \\"rank\\" \\\\ with\\nnewline \xc3\xbcn\xc3\xaf"' in body


def test_gzip_is_reused_while_the_body_stays(registry):
    import gzip

    e = Exposition(registry)
    body, _ = e.render("")
    z = e.gzip(body)
    assert gzip.decompress(z) == body and e.gzip(body) is z
    assert gzip.decompress(e.gzip(body + b"# more\n")) == body + b"# more\n"
