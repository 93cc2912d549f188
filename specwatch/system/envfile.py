"""The secrets file of the systemd unit (`EnvironmentFile=-/etc/specwatch/environment`), read
for `specwatch check-config`, so that a config naming `webhook_url_env: VAR` checks in a shell
as it runs under the unit.

Format, as systemd.exec(5) "EnvironmentFile=" (systemd 252) describes it, the subset the
shipped file uses: one `KEY=VALUE` a line; blank lines and lines starting with `#` or `;` are
ignored; whitespace around KEY and VALUE is dropped; a VALUE wholly in single or double quotes
loses them. Anything else (no `=`, a KEY that is not a variable name) is reported, not guessed.
"""

from __future__ import annotations

import os
import re

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse(text: str) -> tuple[dict[str, str], list[str]]:
    """`text` as ({KEY: VALUE}, problems); a problem is "line N: what" (the value never shown)."""
    values: dict[str, str] = {}
    problems: list[str] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, eq, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not _NAME.fullmatch(key):
            problems.append(f"line {n}: not KEY=value (ignored, as systemd ignores it)")
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values, problems


def apply(path: str, environ: os._Environ | dict[str, str] = os.environ) -> tuple[list[str], list[str]]:
    """Put the variables of the file at `path` into `environ` where it has none (a variable set
    in the shell wins). Returns (names added, warnings). An absent file adds nothing; one this
    user may not read (the shipped file is root's, mode 0600) is a warning saying to run as root."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except FileNotFoundError:
        return [], []
    except OSError as e:
        return [], [f"{path}: cannot read it ({e.strerror}): the variables the service gets from it are "
                    "not set here; run check-config as root (sudo) to check them too"]
    values, problems = parse(text)
    added = [k for k in values if not environ.get(k)]
    for k in added:
        environ[k] = values[k]
    return added, [f"{path}: {p}" for p in problems]
