"""One log record, one line: what a client sent never writes a line of its own into perfd's logs.

Agent ids, job names, event kinds and texts come from the network and go into log messages (a refusal
names the agent it turned away). An agent id holding a newline once wrote a forged line into the
aggregator's log. Escaping happens here, once, at the log's edge — the formatter of
every perfd daemon's handler (perfd.app.cli) — and not at each call: a call site that forgets cannot
reopen the hole. Every character Python does not call printable (control characters, line and
paragraph separators, bidirectional overrides, NUL) is written as its escape (``\\n``, ``\\x1b``,
``\\u202e``). A traceback after the message keeps its frames' lines (perfd's own code), and its
exception's message — which may quote what a client sent — is escaped to one line too.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from types import TracebackType

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escaped(text: str) -> str:
    """``text`` with every non-printable character escaped (a space stays a space)."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        elif c in _NAMED:
            out.append(_NAMED[c])
        else:
            n = ord(c)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return "".join(out)


def _exception_lines(te: traceback.TracebackException) -> Iterator[str]:
    """As TracebackException.format(), each exception's own message escaped to one line."""
    if te.__cause__ is not None:
        yield from _exception_lines(te.__cause__)
        yield "\nThe above exception was the direct cause of the following exception:\n\n"
    elif te.__context__ is not None and not te.__suppress_context__:
        yield from _exception_lines(te.__context__)
        yield "\nDuring handling of the above exception, another exception occurred:\n\n"
    if te.stack:
        yield "Traceback (most recent call last):\n"
        yield from te.stack.format()
    yield escaped("".join(te.format_exception_only()).rstrip("\n")) + "\n"


class OneLineFormatter(logging.Formatter):
    """A formatter whose message part is :func:`escaped`, and whose traceback escapes the exceptions'
    messages (:func:`_exception_lines`)."""

    def formatException(self, ei: tuple[type[BaseException], BaseException, TracebackType | None]
                        | tuple[None, None, None]) -> str:
        if ei[1] is None:
            return super().formatException(ei)
        return "".join(_exception_lines(traceback.TracebackException.from_exception(ei[1]))).rstrip("\n")

    def formatMessage(self, record: logging.LogRecord) -> str:
        message = record.message
        record.message = escaped(message)
        try:
            return super().formatMessage(record)
        finally:
            record.message = message
