"""The status page of `specwatch run`: `history` (accept length per rank over the last hour, fed
by the pipeline), `view` (a read-only snapshot of the daemon's state as JSON-ready data),
`page` (that snapshot as one self-contained HTML page with inline SVG charts), `web` (the WSGI
app serving `/`, `/api/status` and, at every other path, /metrics)."""
