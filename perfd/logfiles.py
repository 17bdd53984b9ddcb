"""Opening a log a person points perfd at: plain, gzip or zstd, told apart by the file's first bytes
(not its name), and a clear refusal for what is not a readable file (a directory, a missing path).

Lines come back as bytes split on b"\\n" alone, as LogTail splits them, so a compressed log and
the same log tailed live give the same lines. gzip is stdlib; zstd needs the optional
``zstandard`` package (``pip install 'perfd[zstd]'``), and without it a .zst log is refused with
that sentence rather than read as binary.
"""

from __future__ import annotations

import contextlib
import gzip
import io
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, cast

_GZIP_MAGIC = b"\x1f\x8b"
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


def compression_of(path: str | Path) -> str | None:
    """'gzip', 'zstd' or None (plain), from the first bytes of the file."""
    with Path(path).open("rb") as fh:
        head = fh.read(4)
    if head.startswith(_GZIP_MAGIC):
        return "gzip"
    if head.startswith(_ZSTD_MAGIC):
        return "zstd"
    return None


@contextlib.contextmanager
def open_log(path: str | Path) -> Iterator[BinaryIO]:
    """A binary stream of the log's text, decompressed when the file is gzip or zstd."""
    kind = compression_of(path)
    if kind == "gzip":
        with gzip.open(path, "rb") as gz:
            yield cast(BinaryIO, gz)
        return
    if kind == "zstd":
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
