"""Opening a log a person points perfd at: plain, gzip, xz or zstd, told apart by the file's first
bytes (not its name), and a clear refusal for what is not a readable file (a directory, a missing path).

Lines come back as bytes split on b"\\n" alone, as LogTail splits them, so a compressed log and
the same log tailed live give the same lines. gzip and xz are stdlib; zstd needs the optional
``zstandard`` package (``pip install 'perfd[zstd]'``), and without it a .zst log is refused with
that sentence rather than read as binary.
"""

from __future__ import annotations

import contextlib
import enum
import gzip
import io
import lzma
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

# The formats' first bytes, declared here once (perfd.capture.chrome_trace reads traces by them too).
GZIP_MAGIC = b"\x1f\x8b"
XZ_MAGIC = b"\xfd7zXZ\x00"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class LogFileError(ValueError):
    """A path that cannot be read as a log; the message is one line for a person."""


def check_log_path(path: str) -> None:
    """Raise LogFileError with one line when ``path`` is not a readable regular file."""
    p = Path(path)
    if p.is_dir():
        raise LogFileError(f"{path} is a directory, not a log file")
    if not p.exists():
        raise LogFileError(f"no such log file: {path}")
    if not p.is_file():
        raise LogFileError(f"{path} is not a regular file")


class Compression(enum.Enum):
    """The compressed formats a log or a trace is read in (plain is None). Shown in no output, so the
    members' values are only their names."""

    GZIP = "gzip"
    XZ = "xz"
    ZSTD = "zstd"


def compression_of_bytes(head: bytes) -> Compression | None:
    """The compression of a file's content from its first bytes, or None (plain)."""
    if head.startswith(GZIP_MAGIC):
        return Compression.GZIP
    if head.startswith(XZ_MAGIC):
        return Compression.XZ
    if head.startswith(_ZSTD_MAGIC):
        return Compression.ZSTD
    return None


def compression_of(path: str | Path) -> Compression | None:
    """The compression of the file from its first bytes, or None (plain)."""
    with Path(path).open("rb") as fh:
        head = fh.read(len(XZ_MAGIC))  # the longest magic
    return compression_of_bytes(head)


@contextlib.contextmanager
def open_log(path: str | Path) -> Iterator[BinaryIO]:
    """A binary stream of the log's text, decompressed when the file is gzip, xz or zstd. A truncated
    gzip or xz file raises EOFError when the reader reaches its cut (the callers' "cannot read")."""
    kind = compression_of(path)
    if kind is Compression.GZIP:
        with gzip.open(path, "rb") as gz:
            yield cast(BinaryIO, gz)
        return
    if kind is Compression.XZ:
        try:
            with lzma.open(path, "rb") as xz:
                yield cast(BinaryIO, xz)
        except lzma.LZMAError as exc:  # corrupt, not cut: not an OSError, so say it as the callers refuse
            raise LogFileError(f"{path}: corrupt xz data ({exc})") from None
        return
    if kind is Compression.ZSTD:
        try:
            import zstandard
        except ImportError:
            raise LogFileError(f"{path} is zstd-compressed: install the optional 'zstandard' package "
                               "(pip install 'perfd[zstd]') or decompress it with `zstd -d`") from None
        with Path(path).open("rb") as raw:
            reader = zstandard.ZstdDecompressor().stream_reader(raw)
            yield cast(BinaryIO, io.BufferedReader(reader))
        return
    with Path(path).open("rb") as fh:
        yield fh


def iter_text_lines(path: str | Path) -> Iterator[str]:
    """Every line of the log as text (bytes that are not UTF-8 replaced)."""
    with open_log(path) as fh:
        for raw in fh:
            yield raw.decode("utf-8", "replace")
