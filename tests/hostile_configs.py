"""Config files a user or an attacker may hand specwatch (issue #10 item 17), each with the text its
refusal must contain (a key path or line, and what is wrong)."""

from __future__ import annotations

from pathlib import Path

BINARY = Path(__file__).resolve().parent / "data" / "binary-secret.bin"  # a URL, then bytes no text file holds


def alias_bomb() -> bytes:
    """"Billion laughs": 9 levels of 9 aliases, 9**9 values once expanded."""
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return ("\n".join(lines) + "\n").encode()


def cases(good: str) -> dict[str, tuple[bytes, str]]:
    """name → (file content, text the refusal must contain). `good`: a valid config without
    `server`, `follow`, `metrics` or `alerts` (the cases add one)."""
    g = good.encode()
    lines = len(good.splitlines())
    return {
        "not UTF-8": (g + b"server: \xff\n", f"server at line {lines + 1}, column 9: byte 0xff is not UTF-8"),
        "binary": (bytes(range(256)) * 16, "line 1: a NUL byte: this is a binary file"),
        "nested 5000 deep": (b"logs: " + b"[" * 5000 + b"]" * 5000 + b"\n",
                             "logs[0][0][0][0][0]"),
        "alias bomb": (alias_bomb(), "expand to more than 20000 values"),
        "recursive alias": (b"logs: &x [*x]\n", "logs: the alias at line 1 refers to its own anchor"),
        "empty": (b"# nothing but a comment\n", "(file): empty"),
        "path is a number": (b"logs: [{path: 123}]\n", "logs[0].path: must be a string, got 123"),
        "max_line_bytes 1e29": (g + b"follow: {max_line_bytes: 100000000000000000000000000000}\n",
                                "follow.max_line_bytes: must be <= 16777216"),
        "min_batches 1e20": (g + b"rules: {collapse: {min_batches: 100000000000000000000}}\n",
                             "rules.collapse.min_batches: must be <= 1000000"),
        "group_interval 1e20 days": (g + b"alerts: {group_interval: 99999999999999999999d}\n",
                                     "alerts.group_interval: must be at most 365d"),
        "listen_address 999.1.1.1": (g + b"metrics: {listen_address: 999.1.1.1}\n",
                                     "metrics.listen_address: '999.1.1.1' is not an IP address or host name"),
        "duplicate key": (g + b"server: a\nserver: b\n",
                          f"server: duplicate key at line {lines + 1} and line {lines + 2}"),
        "control character": (g + b"server: a\x01b\n", f"line {lines + 1}: character #x0001 is not allowed"),
        "a 10,000-digit integer": (g + b"server: " + b"7" * 10_000 + b"\n",
                                   "a value cannot be read"),
        # a path the OS cannot open: check-config passed it, `run` died with a traceback
        "NUL in state_dir": (g + b'state_dir: "/var/lib/spec\\0watch"\n', "state_dir: contains a NUL character"),
        "NUL in a log path": (b'logs: ["/var/log/sglang/server\\0.log"]\n', "logs[0].path: contains a NUL character"),
        "listen_address with a newline": (g + b'metrics: {listen_address: "0.0.0.0\\n"}\n',
                                          "metrics.listen_address: '0.0.0.0\\n' is not an IP address or host name"),
        "a URL with a newline": (g + b'server_api: {url: "http://127.0.0.1:30000\\n"}\n',
                                 "server_api.url: must be an http(s) base URL"),
        # a secret file read without a bound: a SIGHUP blocked for seconds
        "webhook_url_file /dev/zero": (g + b"alerts: {slack: {webhook_url_file: /dev/zero}}\n",
                                       "alerts.slack.webhook_url_file: '/dev/zero': is not a regular file"),
        "binary webhook_url_file": (g + f"alerts: {{slack: {{webhook_url_file: {BINARY}}}}}\n".encode(),
                                    "is binary (not UTF-8 text, or control characters)"),
        "logs: 0": (b"logs: 0\n", "logs: must be a list"),
        "logs: false": (b"logs: false\n", "logs: must be a list"),
        "logs: {}": (b"logs: {}\n", "logs: must be a list"),
    }

