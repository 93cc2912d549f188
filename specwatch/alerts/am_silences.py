"""Silences in Alertmanager, made and ended the way `amtool silence add|query|expire` does.

Alertmanager's API v2 (api/v2/openapi.yaml, Alertmanager 0.25):
`POST /api/v2/silences` with `{matchers: [{name, value, isRegex, isEqual}], startsAt, endsAt,
createdBy, comment}` answers `{silenceID}`; `GET /api/v2/silences` lists them (expired ones
too, with `status.state`); `DELETE /api/v2/silence/{id}` ends one; `GET /api/v2/status` names
the cluster the Alertmanager is in (`cluster.name`, `cluster.peers[].name`).

The members of one cluster share their silences by gossip: a silence posted to each would be
one silence per member. So the URLs are grouped by cluster first (`clusters`: two are one when
one's status names the other's peer among its peers), and a silence is made in one member of
each (the next one when a member does not answer). A URL that does not answer its status is a
cluster of its own. Errors are returned per cluster, never raised: the caller keeps the local
silence and says which Alertmanager lacks it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import quote

from specwatch.alerts.matchers import Matcher
from specwatch.alerts.model import iso8601
from specwatch.sources.server_api import shown_url

SILENCES = "/api/v2/silences"
ONE_SILENCE = "/api/v2/silence/"
STATUS = "/api/v2/status"


@dataclass
class Cluster:
    """Alertmanagers that share their silences: `urls` (base URLs, in the given order)."""

    urls: list[str]

    @property
    def name(self) -> str:
        """`alertmanager/host:port[+host:port...]`, without credentials, for messages."""
        return "alertmanager/" + "+".join(shown_url(u).split("://", 1)[-1].rstrip("/") for u in self.urls)


@dataclass
class RemoteSilence:
    """One silence as an Alertmanager lists it. Times: seconds since the epoch."""

    id: str
    matchers: list[Matcher]
    starts_at: float
    ends_at: float
    updated_at: float
    created_by: str
    comment: str
    state: str  # Alertmanager's `status.state`: active, pending, expired
    cluster: Cluster = field(repr=False)  # where it is

    def to_dict(self) -> dict:
        return {"id": self.id, "matchers": [str(m) for m in self.matchers], "starts_at": self.starts_at,
                "ends_at": self.ends_at, "created_by": self.created_by, "comment": self.comment,
                "updated_at": self.updated_at, "state": self.state, "alertmanager": self.cluster.name}


class _Api:
    """GET/POST/DELETE on Alertmanagers with one `requests.Session` (imported when used)."""

    def __init__(self, timeout: float):
        from specwatch.notifiers.http import new_session

        self.session = new_session()
        self.timeout = timeout

    def call(self, method: str, url: str, path: str, body: dict | None = None):
        """The JSON answer of `method url+path` (None when empty). Raises OSError with a message
        naming the Alertmanager and what it answered."""
        import requests

        where = shown_url(url).rstrip("/") + path
        try:
            r = self.session.request(method, url.rstrip("/") + path, json=body, timeout=self.timeout,
                                     allow_redirects=False)
        except requests.RequestException as e:
            raise OSError(f"{where}: no answer ({type(e).__name__})") from None
        if not 200 <= r.status_code < 300:
            raise OSError(f"{where}: HTTP {r.status_code} {r.text.strip()[:200]}")
        try:
            return r.json() if r.content.strip() else None
        except ValueError:
            raise OSError(f"{where}: not JSON: {r.text.strip()[:200]!r}") from None


def clusters(urls: list[str], timeout: float) -> list[Cluster]:
    """`urls` grouped by the cluster each is in (`GET /api/v2/status`), in their order."""
    api = _Api(timeout)
    names: list[tuple[str, set[str]]] = []  # per URL: (its peer name, the peer names it knows)
    for u in urls:
        try:
            c = (api.call("GET", u, STATUS) or {}).get("cluster") or {}
            known = {p.get("name", "") for p in c.get("peers") or []} - {""}
            names.append((c.get("name") or "", known if c.get("status") != "disabled" else set()))
        except (OSError, AttributeError):  # said by the call that needs it (create, query)
            names.append(("", set()))
    group = list(range(len(urls)))
    for i, (name_i, known_i) in enumerate(names):
        for j in range(i):
            name_j, known_j = names[j]
            if (name_j and name_j in known_i) or (name_i and name_i in known_j):
                old, new = group[i], group[j]
                group = [new if g == old else g for g in group]
    out: dict[int, Cluster] = {}
    for i, u in enumerate(urls):
        out.setdefault(group[i], Cluster([])).urls.append(u)
    return list(out.values())


def create(found: list[Cluster], matchers: list[Matcher], starts_at: float, ends_at: float, *,
           created_by: str, comment: str, timeout: float) -> tuple[dict[str, str], list[str]]:
    """Make the silence in one member of each cluster. Returns ({base URL: silence ID} for
    every member of the clusters that took it, [one message per cluster that did not])."""
    api = _Api(timeout)
    body = {"matchers": [m.to_dict() for m in matchers], "startsAt": iso8601(starts_at),
            "endsAt": iso8601(ends_at), "createdBy": created_by, "comment": comment}
    ids: dict[str, str] = {}
    failed: list[str] = []
    for c in found:
        why = []
        for u in c.urls:
            try:
                sid = str((api.call("POST", u, SILENCES, body) or {})["silenceID"])
            except (OSError, KeyError, TypeError) as e:
                why.append(str(e) if isinstance(e, OSError) else f"{shown_url(u)}: no silenceID in its answer")
                continue
            ids.update(dict.fromkeys(c.urls, sid))
            break
        else:
            failed.append(f"{c.name}: " + "; ".join(why))
    return ids, failed


def query(found: list[Cluster], timeout: float) -> tuple[list[RemoteSilence], list[str]]:
    """The silences of each cluster (from its first member that answers), and one message per
    cluster that did not answer."""
    api = _Api(timeout)
    out: list[RemoteSilence] = []
    failed: list[str] = []
    for c in found:
        why = []
        for u in c.urls:
            try:
                listed = api.call("GET", u, SILENCES) or []
                out.extend(_remote(d, c) for d in listed)
            except (OSError, KeyError, TypeError, ValueError) as e:
                why.append(str(e) if isinstance(e, OSError) else f"{shown_url(u)}: unexpected silence ({e})")
                continue
            break
        else:
            failed.append(f"{c.name}: " + "; ".join(why))
    return out, failed


def expire(ids: dict[str, str], timeout: float) -> list[str]:
    """End silence `ids[url]` in each Alertmanager (one call per silence ID: the members of a
    cluster share it; the next member when one does not answer). One already expired is ended
    too. Returns one message per silence ID that could not be ended."""
    api = _Api(timeout)
    by_id: dict[str, list[str]] = {}
    for u, sid in ids.items():
        by_id.setdefault(sid, []).append(u)
    failed = []
    for sid, urls in by_id.items():
        why = []
        for u in urls:
            try:
                api.call("DELETE", u, ONE_SILENCE + quote(sid, safe=""))
            except OSError as e:
                if "already expired" in str(e):
                    break
                why.append(str(e))
                continue
            break
        else:
            failed.append(f"silence {sid}: " + "; ".join(why))
    return failed


def _remote(d: dict, cluster: Cluster) -> RemoteSilence:
    return RemoteSilence(id=str(d["id"]), matchers=[Matcher.from_dict(m) for m in d["matchers"]],
                         starts_at=_seconds(d["startsAt"]), ends_at=_seconds(d["endsAt"]),
                         updated_at=_seconds(d.get("updatedAt") or d["startsAt"]),
                         created_by=str(d.get("createdBy", "")), comment=str(d.get("comment", "")),
                         state=str((d.get("status") or {}).get("state", "")), cluster=cluster)


def _seconds(text: str) -> float:
    """RFC 3339 (`2026-12-02T02:30:00.123456789Z`, as Alertmanager writes it) → epoch seconds."""
    return datetime.fromisoformat(str(text)).timestamp()
