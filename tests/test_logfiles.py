"""perfd.core.logfiles: a compressed log is told by its first bytes and reads as the plain one; a cut
archive raises what the commands refuse with one line ("cannot read"), whichever its format."""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path

import pytest

from perfd.core.logfiles import Compression, LogFileError, compression_of, iter_text_lines

ROOT = Path(__file__).resolve().parents[1]
MEGATRON = ROOT / "tests" / "data" / "megatron" / "tp2_mha_gelu.log"
PACK = {Compression.GZIP: gzip.compress,
        Compression.XZ: lambda b: lzma.compress(b, preset=9 | lzma.PRESET_EXTREME)}


@pytest.mark.parametrize("kind", list(PACK), ids=[k.value for k in PACK])
def test_a_compressed_log_reads_as_the_plain_one_whatever_it_is_called(
        tmp_path: Path, kind: Compression) -> None:
    log = tmp_path / "train.log"  # no .gz / .xz: the bytes say what it is
    log.write_bytes(PACK[kind](MEGATRON.read_bytes()))
    assert compression_of(log) == kind
    assert list(iter_text_lines(log)) == list(iter_text_lines(MEGATRON))
    assert compression_of(MEGATRON) is None


@pytest.mark.parametrize("kind", list(PACK), ids=[k.value for k in PACK])
def test_a_cut_archive_raises_eof_as_gzip_does(tmp_path: Path, kind: Compression) -> None:
    bad = tmp_path / "train.log"
    bad.write_bytes(PACK[kind](MEGATRON.read_bytes())[:4000])
    with pytest.raises(EOFError, match="ended before the end-of-stream marker"):
        list(iter_text_lines(bad))


def test_corrupt_xz_is_a_log_file_error(tmp_path: Path) -> None:
    packed = PACK[Compression.XZ](MEGATRON.read_bytes())
    bad = tmp_path / "train.log.xz"
    bad.write_bytes(packed[:200] + bytes(64) + packed[264:])  # the header kept, the data scrambled
    with pytest.raises(LogFileError, match="corrupt xz data"):
        list(iter_text_lines(bad))
