"""What a command line runs: the one fact both engines' settings readers need from a process's
argv (`server_settings` for SGLang, `vllm_settings` for vLLM)."""

from __future__ import annotations

from pathlib import PurePosixPath


def python_program(argv: list[str] | tuple[str, ...]) -> tuple[str, str, list[str]] | None:
    """What a Python command line runs: ("module", name, the arguments after it) for `-m name`
    (or `-mname`), ("script", path, the arguments after it) for a file; None for `-c`, stdin, or
    a program that is not a Python interpreter. The interpreter's own options are skipped."""
    if not argv or not PurePosixPath(argv[0]).name.startswith(("python", "pypy")):
        return None
    argv = list(argv)
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "-m" or (tok.startswith("-m") and not tok.startswith("--")):
            if tok == "-m":
                return ("module", argv[i + 1], argv[i + 2:]) if i + 1 < len(argv) else None
            return "module", tok[2:], argv[i + 1:]
        if tok in ("-X", "-W", "--check-hash-based-pycs"):
            i += 2  # an interpreter option with a separate argument
            continue
        if tok.startswith("-c") or tok == "-":
            return None  # a -c program or stdin
        if tok.startswith("-"):
            i += 1
            continue
        return "script", tok, argv[i + 1:]
    return None
