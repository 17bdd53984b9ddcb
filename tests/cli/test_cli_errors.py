"""Bad input to `perfd analyze` as a person meets it: the CLI's own entry point (in the test's process,
tests/cli_main.py), exit status 2 and one line on stderr, never a page of n/a with status 0."""

from __future__ import annotations

import gzip
import lzma
import os
import pty
import sys
import threading
from pathlib import Path

import pytest

from perfd.app.cli import _subparsers, build_parser
from tests.cli_main import Ran
from tests.cli_main import perfd as run_perfd

ROOT = Path(__file__).resolve().parents[2]
MEGATRON = ROOT / "tests" / "data" / "megatron" / "tp2_mha_gelu.log"
SGLANG = ROOT / "perfd" / "collectors" / "sglang" / "tests" / "data" / "sglang_0_5_5_dp2.log"

# What other frameworks print (formats of PyTorch Lightning's progress bar and HF Trainer's log dict).
LIGHTNING = ("GPU available: True (cuda), used: True\n"
             "Epoch 0:  50%|█████     | 5/10 [00:01<00:01,  4.10it/s, v_num=0, train_loss=2.31]\n"
             "Epoch 0: 100%|██████████| 10/10 [00:02<00:00,  4.21it/s, v_num=0, train_loss=2.05]\n"
             "`Trainer.fit` stopped: `max_epochs=1` reached.\n")
HF_TRAINER = ("***** Running training *****\n  Num examples = 1,000\n  Num Epochs = 1\n"
              "{'loss': 2.3012, 'grad_norm': 1.53, 'learning_rate': 4.5e-05, 'epoch': 0.1}\n"
              "{'train_runtime': 12.3, 'train_samples_per_second': 81.2, 'epoch': 1.0}\n")


@pytest.fixture
def perfd(capsys: pytest.CaptureFixture[str]):
    def run(*args: str | Path) -> Ran:
        return run_perfd(capsys, *args)
    return run


def one_line_refusal(r: Ran) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("perfd: "), r.stderr
    assert r.stdout == ""
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("what", ["megatron", "sglang"])
@pytest.mark.parametrize("text", ["", LIGHTNING, HF_TRAINER], ids=["empty", "lightning", "hf-trainer"])
def test_no_iteration_lines_exit_2(tmp_path, what, text, perfd):
    log = tmp_path / "train.log"
    log.write_text(text)
    line = one_line_refusal(perfd("analyze", what, log))
    assert "train.log" in line and "lines read" in line


@pytest.mark.slow
@pytest.mark.parametrize("what", ["megatron", "sglang"])
def test_directory_is_named_a_directory(tmp_path, what, perfd):
    line = one_line_refusal(perfd("analyze", what, tmp_path))
    assert "is a directory" in line and "no such" not in line
    assert "no such log file" in one_line_refusal(perfd("analyze", what, tmp_path / "missing.log"))


@pytest.mark.slow
def test_gzip_xz_and_zstd_logs_read_as_text(tmp_path, perfd):
    plain = perfd("analyze", "megatron", MEGATRON, "--gpu", "NVIDIA H200", "--json")
    assert plain.returncode == 0, plain.stderr
    gz = tmp_path / "train.log.gz"
    gz.write_bytes(gzip.compress(MEGATRON.read_bytes()))
    # Compression is told from the bytes, not the name: a .log that is gzip is read too.
    disguised = tmp_path / "other.log"
    disguised.write_bytes(gz.read_bytes())
    xz = tmp_path / "train.log.xz"
    xz.write_bytes(lzma.compress(MEGATRON.read_bytes()))
    zstandard = pytest.importorskip("zstandard")
    zst = tmp_path / "train.log.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(MEGATRON.read_bytes()))
    for f in (gz, disguised, xz, zst):
        r = perfd("analyze", "megatron", f, "--gpu", "NVIDIA H200", "--json", "--job", "tp2")
        assert r.returncode == 0, r.stderr
        assert '"parse"' in r.stdout
        import json

        a, b = json.loads(plain.stdout), json.loads(r.stdout)
        assert a["summary"] == b["summary"]
        assert a["parse"]["counts"] == b["parse"]["counts"]


@pytest.mark.slow
def test_zstd_without_the_package_says_what_to_install(tmp_path, perfd, monkeypatch):
    zstandard = pytest.importorskip("zstandard")
    zst = tmp_path / "train.log.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(b"hello\n"))
    # perfd imports zstandard where it reads a .zst (perfd.core.logfiles): None in sys.modules makes that
    # import fail as it does where the package is not installed; monkeypatch puts the module back.
    monkeypatch.setitem(sys.modules, "zstandard", None)
    line = one_line_refusal(perfd("analyze", "megatron", zst))
    assert "zstandard" in line and "perfd[zstd]" in line


@pytest.mark.slow
@pytest.mark.parametrize("pack", [gzip.compress, lzma.compress], ids=["gzip", "xz"])
def test_truncated_archive_is_refused(tmp_path, pack, perfd):
    bad = tmp_path / "train.log"  # the bytes say what it is
    bad.write_bytes(pack(MEGATRON.read_bytes())[:4000])  # truncated archive
    assert "cannot read" in one_line_refusal(perfd("analyze", "megatron", bad))


@pytest.mark.slow
@pytest.mark.parametrize("what,log", [("megatron", MEGATRON), ("sglang", SGLANG)])
def test_unknown_gpu_lists_the_closest_known_names(what, log, perfd):
    line = one_line_refusal(perfd("analyze", what, log, "--gpu", "NVIDIA H2000"))
    assert "unknown GPU 'NVIDIA H2000'" in line and "'NVIDIA H200'" in line
    line = one_line_refusal(perfd("analyze", what, log, "--gpu", "RTX 4090"))
    assert "closest known" in line and "--peak-tflops" in line


@pytest.mark.slow
def test_ambiguous_short_name_lists_its_variants(perfd):
    line = one_line_refusal(perfd("analyze", "megatron", MEGATRON, "--gpu", "H100"))
    could_mean = line.split("it could mean: ")[1].split(";")[0]
    assert "'NVIDIA H100 PCIe'" in could_mean and "'NVIDIA H100 NVL'" in could_mean
    assert "'NVIDIA H100 80GB HBM3'" in could_mean and "H200" not in could_mean


@pytest.mark.slow
def test_known_gpu_or_explicit_peak_is_accepted(perfd):
    assert perfd("analyze", "megatron", MEGATRON, "--gpu", "NVIDIA H100 80GB HBM3").returncode == 0
    assert perfd("analyze", "megatron", MEGATRON, "--gpu", "RTX 4090", "--peak-tflops", "165").returncode == 0


@pytest.mark.slow
def test_missing_dtype_names_the_flag(tmp_path, perfd):
    # The same real log with the lines that name its dtype taken out.
    lines = [ln for ln in MEGATRON.read_text().splitlines(keepends=True)
             if not any(k in ln for k in (" bf16 ", " fp16 ", " params_dtype ", " fp8 "))]
    log = tmp_path / "nodtype.log"
    log.write_text("".join(lines))
    r = perfd("analyze", "megatron", log, "--gpu", "NVIDIA H200")
    assert r.returncode == 0, r.stderr
    assert "--dtype" in r.stdout
    fixed = perfd("analyze", "megatron", log, "--gpu", "NVIDIA H200", "--dtype", "bf16")
    assert "MFU" in fixed.stdout and "give --dtype" not in fixed.stdout


def test_every_option_has_help_and_shows_its_default_and_every_command_an_example():
    import argparse

    for p in _subparsers(build_parser()):
        text = p.format_help()
        assert "example:" in text, f"{p.prog}: no example in --help"
        for a in p._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
                continue
            assert a.help, f"{p.prog} {a.option_strings[0]}: no help text"
            if a.default not in (None, False, []) and a.nargs != 0:
                assert "default" in (p._get_formatter()._get_help_string(a) or ""), (p.prog, a.option_strings)


@pytest.mark.slow
def test_help_of_a_command_shows_example_and_defaults(perfd):
    r = perfd("analyze", "sglang", "--help")
    assert r.returncode == 0
    assert "example:\n  perfd analyze sglang" in r.stdout
    assert "(default 10)" in r.stdout or "(default: 10.0)" in r.stdout


@pytest.mark.slow
def test_progress_bar_on_a_terminal_only(tmp_path, perfd, monkeypatch):
    """A big log shows a bar on stderr when stderr is a terminal (a pty here), nothing otherwise;
    stdout (the report) is the same either way."""
    log = tmp_path / "big.log"
    noise = "WARNING: a line another component printed between iterations\n" * 150_000  # ~9.5 MB
    log.write_text(noise + MEGATRON.read_text())
    args = ["analyze", "megatron", log, "--gpu", "NVIDIA H200"]
    plain = perfd(*args)
    assert plain.returncode == 0 and plain.stderr == ""

    master, slave = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:  # read while it runs: a full pty buffer would block the writer
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO once the slave is closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    tty = open(slave, "w", encoding="utf-8", closefd=True)  # closed in finally
    try:
        # The command's stderr the pty's slave, as a terminal it was started in (sys.stderr back after).
        with monkeypatch.context() as m:
            m.setattr(sys, "stderr", tty)
            m.setenv("COLUMNS", "120")
            m.setenv("TERM", "xterm")
            r = perfd(*args)
            tty.flush()
    finally:
        tty.close()
        reader.join(timeout=10)
        os.close(master)
    seen = b"".join(chunks)
    assert r.returncode == 0
    assert r.stdout == plain.stdout
    assert b"reading big.log" in seen
