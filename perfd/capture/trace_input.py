"""A trace file's JSON, read within a budget (perfd.capture.chrome_trace parses what this returns).

A Kineto trace is written by the job's own process, and the root agent reads it (so does ``perfd
analyze trace``, on a file from anywhere): its size says nothing of what it inflates to. A 0.5 MB
gzip of JSON whitespace inflated to 1 GB and took a root agent from 62 to 1,092 MB; a 1 MB gzip took
``perfd analyze trace`` to 2.1 GB, a 0.2 MB xz to 2.15 GB. So every bound is
enforced while the file streams in, never after the whole of it is inflated:

- the file must be a regular file (a FIFO put where a trace should be is never waited on: opened
  without blocking; a device such as /dev/zero never ends) of at most ``MAX_TRACE_FILE_BYTES`` when
  compressed, ``MAX_TRACE_INFLATED_BYTES`` when plain, counted again as it is read (it may grow);
- gzip, xz and zstd (with the optional ``zstandard`` package) are inflated a chunk at a time, and the
  reading stops once the text passes ``MAX_TRACE_INFLATED_BYTES`` (whitespace padding and a single
  huge string are bytes like any other) or its JSON values pass ``MAX_TRACE_JSON_VALUES`` (what the
  parse builds is an object or more per value: ``[{},{},...]`` is 3 bytes a dict);
- text that decodes wider than a byte a character (any character past U+00FF widens the whole
  string the parser reads to 2 or 4 bytes each) is charged that width against the byte budget, and so
  is ASCII text holding a ``\\uXXXX`` escape past U+00FF (it widens the whole string the parse builds
  around it: a 90 MB string ending in ``\\ud83d\\ude00`` parsed to 360 MB), and UTF-16 text twice
  (each character of its half as many may parse to 4 bytes), all checked a chunk at a time;
- nesting deeper than the JSON parser recurses is refused (its RecursionError, named).

A refusal is :class:`TraceRefused`: its ``reason`` (perfd.core.limits.TRACE_REFUSED_REASONS) is what the
agent counts, its message one line naming the cap. A truncated archive still raises EOFError.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from perfd.core import limits as L
from perfd.core.logfiles import XZ_MAGIC, Compression, compression_of_bytes

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_CHUNK = 1 << 20  # inflated bytes per read: what the budget overshoots by at most
# What widens a Python string: UTF-8 lead bytes of U+0100-U+FFFF (2 bytes each) and of characters
# past U+FFFF (4 bytes each; \xf0-\xf4), and the JSON escapes that parse to them: \u0100-\uFFFF, and
# a high surrogate (\uD800-\uDBFF: with its low one, a character past U+FFFF). Only an escape's first
# 4 bytes are matched (an escaped backslash before a "u" is charged too: over, never under). Each is
# searched alone, at C speed: a literal prefix, or the few bytes left once the narrow ones are deleted.
_NARROW = bytes(range(0xC4))  # ASCII, UTF-8 continuation bytes, lead bytes of U+0080-U+00FF
_LEAD4 = re.compile(rb"[\xf0-\xf4]")
_ESCAPE2 = re.compile(rb"\\u(?:0[1-9a-fA-F]|[1-9a-fA-F])")
_ESCAPE4 = re.compile(rb"\\u[dD][89abAB]")
_STRADDLE = 3  # bytes of the text before a chunk searched with it: an escape split between two chunks


class TraceRefused(ValueError):
    """A trace past one of its caps; ``reason`` is one of perfd.core.limits.TRACE_REFUSED_REASONS."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(f"refused ({reason}): {text}")
        self.reason = reason


@dataclass(frozen=True)
class TraceCaps:
    """The caps one read is held to (perfd.core.limits by default; tests pass smaller ones)."""

    file_bytes: int = L.MAX_TRACE_FILE_BYTES
    inflated_bytes: int = L.MAX_TRACE_INFLATED_BYTES
    json_values: int = L.MAX_TRACE_JSON_VALUES


TRACE_CAPS = TraceCaps()


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class _Capped(io.RawIOBase):
    """The file's bytes, refused once more than ``cap`` have been read (a file growing meanwhile)."""

    def __init__(self, fh: io.FileIO, cap: int, what: str) -> None:
        super().__init__()
        self._fh, self._left, self._cap, self._what = fh, cap, cap, what

    def readable(self) -> bool:
        return True

    def readinto(self, b: WriteableBuffer) -> int:
        n = self._fh.readinto(b) or 0
        self._left -= n
        if self._left < 0:
            raise TraceRefused(L.TRACE_REFUSED_FILE, f"the file grew past {_size(self._cap)} while it was "
                                                     f"read, the most {self._what}")
        return n


def _stream(raw: io.BufferedReader, kind: Compression | None) -> _Readable:
    """What reads the inflated text, a chunk at a time, from ``raw``."""
    if kind is Compression.GZIP:
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if kind is Compression.XZ:
        return lzma.LZMAFile(raw)
    if kind is Compression.ZSTD:
        try:
            import zstandard
        except ImportError:
            raise ValueError("a zstd-compressed trace: install the optional 'zstandard' package "
                             "(pip install 'perfd[zstd]') or decompress it with `zstd -d`") from None
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    return raw


def read_trace_bytes(path: str | Path, caps: TraceCaps = TRACE_CAPS) -> bytearray:
    """The trace's JSON text (inflated), within ``caps``; TraceRefused past any of them."""
    # O_NONBLOCK: opening a FIFO for reading would wait for a writer; a regular file ignores it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb", buffering=0) as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TraceRefused(L.TRACE_REFUSED_FILE, "not a regular file (a FIFO, a device or a socket is "
                                                     "never read as a trace)")
        kind = compression_of_bytes(os.pread(fd, len(XZ_MAGIC), 0))
        cap, what = ((caps.file_bytes, "a compressed trace may be (perfd.core.limits.MAX_TRACE_FILE_BYTES)")
                     if kind is not None else
                     (caps.inflated_bytes,
                      "a plain trace may be (perfd.core.limits.MAX_TRACE_INFLATED_BYTES)"))
        if st.st_size > cap:
            raise TraceRefused(L.TRACE_REFUSED_FILE, f"{st.st_size:,} bytes on disk, more than {_size(cap)}, "
                                                     f"the most {what}")
        return _inflate(_stream(io.BufferedReader(_Capped(fh, cap, what)), kind), caps)


def _past(reason: str, what: str, cap: str, name: str) -> TraceRefused:
    return TraceRefused(reason, f"{what} past {cap}, the most a trace may hold (perfd.core.limits.{name})")


def _inflate(stream: _Readable, caps: TraceCaps) -> bytearray:
    text = bytearray()  # grown in place (no copy of what is held at each step)
    values, width = 0, 1
    while chunk := stream.read(_CHUNK):
        if len(text) + len(chunk) > caps.inflated_bytes:
            raise _past(L.TRACE_REFUSED_INFLATED, "it inflates", _size(caps.inflated_bytes),
                        "MAX_TRACE_INFLATED_BYTES")
        # Every value but a container's first follows a comma, and a container's first follows its
        # bracket: an upper bound on the values the parse would build (a comma or a brace inside a
        # string counts too), at C speed.
        values += chunk.count(b",") + chunk.count(b"{") + chunk.count(b"[")
        if values > caps.json_values:
            raise _past(L.TRACE_REFUSED_VALUES, "its JSON values go", f"{caps.json_values:,}",
                        "MAX_TRACE_JSON_VALUES")
        start = max(0, len(text) - _STRADDLE)
        text += chunk
        width = _widen(text, start, width)
        if len(text) * width > caps.inflated_bytes:
            raise _past(L.TRACE_REFUSED_INFLATED, f"its {len(text):,} bytes read decode to {width} bytes a "
                        "character,", _size(caps.inflated_bytes), "MAX_TRACE_INFLATED_BYTES")
    return text


def _widen(text: bytearray, start: int, width: int) -> int:
    """The bytes a character the parse of ``text`` may take: ``width`` (what ``text[:start]`` takes),
    or more for what ``text[start:]`` holds."""
    if width < 2 and json.detect_encoding(text[:4]).startswith("utf-16"):
        width = 2  # half as many characters as bytes, each up to 4 bytes (its escapes go unmatched)
    if width == 4:
        return width
    new = text[start:]
    if not new.isascii() and (lead := new.translate(None, _NARROW)):
        width = max(width, 4 if _LEAD4.search(lead) else 2)
    if width < 4 and _ESCAPE4.search(new):
        return 4
    if width < 2 and _ESCAPE2.search(new):
        return 2
    return width


def load_trace_json(path: str | Path, caps: TraceCaps = TRACE_CAPS) -> object:
    """The trace's JSON document, read and parsed within ``caps``. ValueError when it is not JSON."""
    raw = read_trace_bytes(path, caps)
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    del raw  # the text alone is held while it is parsed
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from e
    except RecursionError:
        raise TraceRefused(L.TRACE_REFUSED_DEPTH, "JSON nested deeper than the parser recurses (Python's "
                                                  "recursion limit)") from None
