"""The status page of `specwatch run`'s listener (specwatch/system/listener.py routes to it): the page
at `/`, its data as JSON at `/api/status`, and another app (the listener's 404) at every other path.

`/?refresh=N` sets the page's reload interval in seconds (0: no reload; default 10). The page is
built per request (no background work); its Content-Security-Policy lets the browser load
nothing (no script, no image, no font) but the page's own inline style.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs

from specwatch.status.view import StatusView

REFRESH = 10  # seconds
CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"


def status_app(view: StatusView, other_app):
    """WSGI app: `/` and `/api/status` from `view`, anything else to `other_app`."""

    def app(environ, start_response):
        path = environ.get("PATH_INFO") or "/"
        if path == "/api/status":
            body = json.dumps(view.snapshot(), allow_nan=False).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Cache-Control", "no-store")])
            return [body]
        if path == "/":
            from specwatch.status.page import render  # imported on the first page view only

            try:
                refresh = max(0, int(parse_qs(environ.get("QUERY_STRING", "")).get("refresh", [REFRESH])[0]))
            except ValueError:
                refresh = REFRESH
            body = render(view.snapshot(), refresh=refresh).encode()
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8"), ("Cache-Control", "no-store"),
                                      ("Content-Security-Policy", CSP), ("X-Content-Type-Options", "nosniff")])
            return [body]
        return other_app(environ, start_response)

    return app
