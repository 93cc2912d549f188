"""`ast.parse` and `ast.literal_eval` behind one process-wide lock.

CPython 3.11 keeps the AST constructor's recursion depth in interpreter-wide state, so two
threads building trees at once can fail with `SystemError: AST constructor recursion depth
mismatch` (https://github.com/python/cpython/issues/106905). specwatch builds trees on the
followers' thread (`server_args` lines) and on diagnosis threads (the SGLang sources). Code
outside specwatch can still build trees unlocked (pytest's assertion rewriting, a library), so a
parse that fails with that error is tried again: it is a pure function of its input.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """`ast.parse(source, mode=mode)`; raises what it raises (SyntaxError, ValueError, ...)."""
    for attempt in range(3):
        try:
            with _LOCK:
                return ast.parse(source, mode=mode)
        except SystemError as e:  # CPython 3.11 (issue 106905): another thread's tree got in the way
            if "recursion depth mismatch" not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def literal_eval(node_or_string):
    """`ast.literal_eval`; raises what it raises (ValueError, SyntaxError, ...)."""
    with _LOCK:
        return ast.literal_eval(node_or_string)
