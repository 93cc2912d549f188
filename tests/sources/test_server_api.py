"""ServerApiSource against a local HTTP server that answers like SGLang 0.5.23, 0.4.9 and
0.4.6.post1, with an API key, a failing /health, slow answers, and a server that is gone."""

from __future__ import annotations

import logging
import socket
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ has no __init__.py
from sglang_http import SGLangHTTP  # noqa: E402

from specwatch.core.events import ApiSample, ServerArgs  # noqa: E402
from specwatch.sources.server_api import (  # noqa: E402
    ServerApiCollector,
    ServerApiSource,
    parse_server_info,
    version_tuple,
)


class Recorder:
    def __init__(self):
        self.events = []

    def __call__(self, server, event, now):
        self.events.append((server, event))

    def samples(self) -> list[ApiSample]:
        return [e for _, e in self.events if isinstance(e, ApiSample)]

    def args(self) -> list[ServerArgs]:
        return [e for _, e in self.events if isinstance(e, ServerArgs)]


@pytest.fixture
def http():
    made = []

    def _make(*a, **kw):
        s = SGLangHTTP(*a, **kw)
        made.append(s)
        return s

    yield _make
    for s in made:
        s.close()


def source(url, rec, **kw):
    kw.setdefault("interval", 10.0)
    kw.setdefault("timeout", 1.0)
    return ServerApiSource(url, rec, server="sglang-0", **kw)


def test_new_version_uses_server_info_only(http):
    srv = http("0.5.23")
    rec = Recorder()
    src = source(srv.url, rec)
    now = time.time()
    assert src.poll(now) == 10.0
    s = rec.samples()[-1]
    assert s.reachable and s.error is None and s.healthy is True and s.health_status == 200
    info = s.info
    assert info.endpoint == "/server_info" and info.version == "0.5.23"
    assert info.startup_time == 1767225600.25
    assert info.architectures == ("LlamaForCausalLM",)
    assert info.args["speculative_algorithm"] == "EAGLE3"
    assert info.args["speculative_draft_model_path"] == "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B"
    assert (info.args["speculative_num_steps"], info.args["speculative_eagle_topk"],
            info.args["speculative_num_draft_tokens"]) == (5, 8, 32)
    assert "launch_command" not in info.args and "mem_fraction_static" not in info.args
    assert [(d.dp_rank, d.avg_spec_accept_length, d.last_gen_throughput) for d in info.dp_states] == [(0, 3.42, 1234.5)]
    args = rec.args()
    assert len(args) == 1 and args[0].source == "server_info" and args[0].args == info.args

    for i in range(3):
        srv.throughput += 10
        src.poll(now + 10 * (i + 1))
    assert srv.hits["/server_info"] == 4
    assert srv.hits["/get_server_info"] == 0  # the deprecated alias logs a warning per call
    assert srv.hits["/model_info"] == 1 and srv.hits["/get_model_info"] == 0
    assert srv.hits["/health"] == 1  # health_interval 60 s
    assert rec.samples()[-1].info.dp_states[0].last_gen_throughput == 1264.5
    assert len(rec.args()) == 1  # unchanged settings are not sent again


@pytest.mark.parametrize("version", ["0.4.9", "0.4.6.post1"])
def test_old_versions_fall_back_to_get_server_info(http, version):
    srv = http(version)
    rec = Recorder()
    src = source(srv.url, rec)
    src.poll(time.time())
    src.poll(time.time() + 10)
    info = rec.samples()[-1].info
    assert info.endpoint == "/get_server_info" and info.version == version
    assert info.architectures == ()  # /get_model_info has none before 0.5.10
    assert info.startup_time is None
    assert [(d.avg_spec_accept_length, d.last_gen_throughput) for d in info.dp_states] == [(3.42, 1234.5)]
    assert srv.hits["/server_info"] == 1  # probed once, 404, never again
    assert srv.hits["/get_server_info"] == 2
    assert srv.hits["/model_info"] == 1 and srv.hits["/get_model_info"] == 1


def test_dp_ranks_each_have_a_state(http):
    srv = http("0.5.23", dp_size=2)
    rec = Recorder()
    source(srv.url, rec).poll(time.time())
    states = rec.samples()[-1].info.dp_states
    assert [(d.dp_rank, d.avg_spec_accept_length, d.last_gen_throughput) for d in states] == [
        (0, 3.42, 1234.5), (1, 3.43, 1235.5)]


def test_upgrade_in_place_moves_back_to_server_info(http):
    srv = http("0.4.9")
    rec = Recorder()
    src = source(srv.url, rec)
    src.poll(time.time())
    srv.version = "0.5.23"  # the old endpoint now reports a version that has the new one
    src.poll(time.time() + 10)
    assert rec.samples()[-1].info.endpoint == "/get_server_info"
    before = srv.hits["/get_server_info"]
    src.poll(time.time() + 20)
    assert rec.samples()[-1].info.endpoint == "/server_info"
    src.poll(time.time() + 30)
    assert srv.hits["/get_server_info"] == before


def test_api_key_sent_as_bearer_and_never_logged(http, caplog):
    srv = http("0.5.23", api_key="sk-very-secret")
    rec = Recorder()
    caplog.set_level(logging.DEBUG)
    wrong = source(srv.url, rec, api_key="sk-wrong")
    wrong.poll(time.time())
    s = rec.samples()[-1]
    assert s.reachable and s.error == "unauthorized" and s.info is None
    assert s.healthy is True  # /health needs no key
    assert "api_key" in caplog.text  # the warning says which setting to fix
    src = source(srv.url, rec, api_key="sk-very-secret")
    src.poll(time.time())
    assert rec.samples()[-1].info is not None
    assert "Bearer sk-very-secret" in srv.auth
    assert "sk-very-secret" not in caplog.text and "sk-wrong" not in caplog.text
    assert "sk-very-secret" not in repr(src)
    assert wrong.next_delay() == 10.0  # still a failure: not polled faster


def test_health_503_and_recovery(http):
    srv = http("0.5.23")
    srv.health_status = 503
    rec = Recorder()
    src = source(srv.url, rec, health_interval=60.0)
    t = time.time()
    src.poll(t)
    s = rec.samples()[-1]
    assert s.info is not None and s.healthy is False and s.health_status == 503
    srv.health_status = 200
    src.poll(t + 10)  # a failing health check is asked again at the normal interval
    assert rec.samples()[-1].healthy is True
    assert srv.hits["/health"] == 2


def test_timeout_is_reported_and_backs_off(http):
    srv = http("0.5.23")
    srv.delay = 1.0
    rec = Recorder()
    src = source(srv.url, rec, timeout=0.2, interval=5.0, backoff_max=30.0)
    src.poll(time.time())
    s = rec.samples()[-1]
    assert s.error == "timeout" and s.reachable and s.info is None
    assert src.next_delay() == 5.0
    src.poll(time.time())
    assert src.next_delay() == 10.0


def test_connection_refused_backoff_doubles_to_the_cap():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rec = Recorder()
    src = source(f"http://127.0.0.1:{port}", rec, interval=5.0, backoff_max=30.0)
    delays = [src.poll(time.time()) for _ in range(5)]
    assert delays == [5.0, 10.0, 20.0, 30.0, 30.0]
    s = rec.samples()[-1]
    assert not s.reachable and s.error == "connection_error" and s.healthy is None


def test_server_comes_back_after_being_gone(http):
    srv = http("0.4.9")
    port = int(srv.url.rsplit(":", 1)[1])
    rec = Recorder()
    src = source(srv.url, rec, interval=5.0)
    src.poll(time.time())
    srv.close()
    assert src.poll(time.time()) == 5.0
    assert not rec.samples()[-1].reachable
    assert src.poll(time.time()) == 10.0
    # the server comes back on the same port, upgraded to 0.5.23
    srv2 = http("0.5.23", port=port)
    assert src.poll(time.time()) == 5.0
    s = rec.samples()[-1]
    assert s.info.endpoint == "/server_info"  # probed again after the outage
    assert srv2.hits["/get_server_info"] == 0
    assert len(rec.args()) == 2  # the settings are sent again for the new instance


def test_bad_json_is_reported(http):
    srv = http("0.5.23")
    srv.routes = lambda: {"/server_info": lambda: ["not", "an", "object"]}
    rec = Recorder()
    source(srv.url, rec).poll(time.time())
    assert rec.samples()[-1].error == "bad_response"


def test_collector_counts_requests_and_errors(http):
    srv = http("0.4.9")
    rec = Recorder()
    src = source(srv.url, rec)
    src.poll(1000.0)
    reg = CollectorRegistry()
    reg.register(ServerApiCollector([src]))
    m = {(s.name, tuple(sorted(s.labels.items()))): s.value
         for f in text_string_to_metric_families(generate_latest(reg).decode()) for s in f.samples}
    assert m[("specwatch_server_api_up", (("server", "sglang-0"),))] == 1
    assert m[("specwatch_server_api_last_success_timestamp_seconds", (("server", "sglang-0"),))] == 1000.0
    assert m[("specwatch_server_api_requests_total", (("endpoint", "/server_info"), ("server", "sglang-0")))] == 1
    assert m[("specwatch_server_api_requests_total", (("endpoint", "/get_server_info"), ("server", "sglang-0")))] == 1
    assert m[("specwatch_server_api_requests_total", (("endpoint", "/health"), ("server", "sglang-0")))] == 1
    assert not any(k[0] == "specwatch_server_api_errors_total" for k in m)  # a 404 probe is not an error


def test_parse_rejects_non_objects_and_reads_versions():
    with pytest.raises(ValueError):
        parse_server_info([])
    assert version_tuple("0.5.6.post1") == (0, 5, 6)
    assert version_tuple("0.4.10rc1") == (0, 4, 10)
    assert version_tuple(None) == ()


def test_credentials_in_the_url_never_reach_logs_errors_or_events(caplog):
    """A `server_api.url` with a user, password or token in it is shown without them."""
    import logging

    from specwatch.sources.server_api import ServerApiSource, shown_url

    assert shown_url("http://user:LEAK7@127.0.0.1:30999/?token=LEAK8") == "http://127.0.0.1:30999/"
    assert shown_url("http://127.0.0.1:30000") == "http://127.0.0.1:30000"
    assert shown_url("http://u:p@[::1]:30000/x?k=v") == "http://[::1]:30000/x"
    events = []
    src = ServerApiSource("http://user:LEAK7@127.0.0.1:9/?token=LEAK8", lambda s, e, n: events.append(e),
                          server="s", timeout=0.2)
    with caplog.at_level(logging.DEBUG):
        for t in range(3):
            src.poll(float(t))
    text = caplog.text + repr(src) + repr(events)
    assert "LEAK7" not in text and "LEAK8" not in text and "user" not in text
    assert events and events[-1].url == "http://127.0.0.1:9"
