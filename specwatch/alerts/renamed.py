"""Alert names that changed, and the matchers written for the old ones.

The alerts about a server that fire for any engine were once named after SGLang (a vLLM
server's down alert read `SGLangServerDown on vllm-0`); they are named for what happened, and
every alert carries the server's `engine` label (`sglang`, `vllm`: `Pipeline.engine_of`).
Alerts whose check only exists on SGLang keep their name (`SGLangLogSilent` reads SGLang's
`/server_info`, `SGLangLogUnrecognized` SGLang's `Decode batch` lines).

A matcher on `alertname` in a config (routes, inhibit rules) or a silence that matches an old
name is widened to match its new name too (`follow_renames`), with a WARNING naming the new one:
what was written for the old names keeps working, and an alert restored from a state saved
before the rename (it keeps its name until it resolves) is still matched. CHANGELOG.md says when.
"""

from __future__ import annotations

import logging
import re

from specwatch.alerts.matchers import Matcher

log = logging.getLogger(__name__)

# old alertname → new alertname
RENAMED: dict[str, str] = {
    "SGLangServerDown": "ServerDown",
    "SGLangServerRestarted": "ServerRestarted",
    "SGLangServerUnhealthy": "ServerUnhealthy",
    "SGLangLogError": "ServerLogError",
}


def follow_renames(matcher: Matcher, where: str) -> Matcher:
    """`matcher`, or where it is on `alertname` and its value names an old name but not its new
    one (`=`/`!=`: is it; `=~`/`!~`: matches it), the same matcher widened to the new names
    (`alertname=SGLangServerDown` → `alertname=~"SGLangServerDown|ServerDown"`, `!=` → `!~`),
    logged as a WARNING that starts with `where` (a key path, a silence) and names the new name
    to write. A matcher written for the new names is returned as it is. Never raises."""
    if matcher.name != "alertname":
        return matcher
    regex = matcher.op in ("=~", "!~")
    pattern = f"(?:{matcher.value})" if regex else re.escape(matcher.value)
    seen = [(old, new) for old, new in RENAMED.items()
            if re.fullmatch(pattern, old) and not re.fullmatch(pattern, new)]
    if not seen:
        return matcher
    widened = Matcher("alertname", "!~" if matcher.op in ("!=", "!~") else "=~",
                      "|".join([pattern] + [new for _, new in seen]))
    names = ", ".join(f"{old} is now {new}" for old, new in seen)
    log.warning("%s: %s names an alert by its old name (%s; the engine is its `engine` label); it is "
                "read as %s: write the new name", where, matcher, names, widened)
    return widened
