"""The README's shell commands run as written.

Every fenced ```bash, ```sh or ```console block of README.md is run with bash (``set -e``: a command
that fails fails the block), in a folder that stands for the clone (the repository's top-level entries
linked into it, so that what a block writes lands there) and with a home of its own, with ``perfd``,
``python3`` and ``python`` this interpreter on this checkout. Where the machine allows namespaces
(``unshare``), each block runs in its own network, pid and mount namespaces: its own loopback, so the
daemons bind the default ports the README shows and several blocks run at once without meeting; its
own ``/run`` (root's hook socket folder); and every process it started ends with it. Elsewhere the
blocks run one after another on the host's loopback, and what each started is found by a variable in
its environment and killed. Each block has a time limit.

A block the machine cannot run says so just before it: ``<!-- needs: WHAT -->`` (a GPU, a cluster, the
network, Docker, the whole suite). Exactly those are skipped, with WHAT as the reason; their ``perfd``
commands are still parsed by perfd's own argument parser, so a flag that no longer exists fails here.

``make demo`` runs its recipe with ``DEMO_VENV`` naming a stand-in for the venv it would make (this
interpreter, with perfd in it), so nothing is installed; ``perfd demo`` itself runs as written.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from perfd.app.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHELLS = ("bash", "sh", "console")
NEEDS = re.compile(r"^<!--\s*needs:\s*(.+?)\s*-->$")
FENCE = re.compile(r"^```(\S*)\s*$")
MARK = "PERFD_README_BLOCK"  # in each block's environment: what it started is found by it
BLOCK_TIMEOUT_S = 150
# What a block's own namespaces need set up before it runs: the loopback up, a /run of its own.
NS_SETUP = "ip link set lo up && mount -t tmpfs -o mode=755 tmpfs /run && "
NS_PREFIX = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--mount-proc"]
# After a block: any of its background jobs still running fails it (the README's blocks stop theirs).
LEFT_CHECK = 'left=$(jobs -pr); if [ -n "$left" ]; then echo "[left running: jobs $left]"; exit 97; fi\n'
# The repository's entries a clone does not have, or that are this checkout's own.
NOT_IN_A_CLONE = {"build", "dist"}

# One worker runs the module: its fixture runs every block once (several at a time), and ~25 s at best.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("readme_commands")]


@dataclass(frozen=True)
class Block:
    line: int  # the opening fence's line in README.md
    lang: str
    script: str  # the commands, as bash runs them
    needs: str | None  # what the machine must have to run it, from the mark before it; None: anything

    @property
    def name(self) -> str:
        return f"README.md:{self.line}"


def _console_commands(body: list[str]) -> str:
    """A ```console block's commands: its ``$ `` lines and their continuations, not the output."""
    out: list[str] = []
    cont = False
    for ln in body:
        if cont or ln.startswith("$ "):
            out.append(ln if cont else ln[2:])
            cont = ln.rstrip().endswith("\\")
    return "\n".join(out)


def readme_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    last = ""  # the last non-blank line outside a block
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                last = lines[i].strip()
            i += 1
            continue
        start, lang, body = i + 1, m.group(1), []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        if lang in SHELLS:
            needs = NEEDS.match(last)
            script = _console_commands(body) if lang == "console" else "\n".join(body)
            blocks.append(Block(start, lang, script, needs.group(1) if needs else None))
        last = ""
        i += 1
    return blocks


BLOCKS = readme_blocks(README.read_text())
RUNNABLE = [b for b in BLOCKS if b.needs is None]


@functools.cache
def namespaces() -> bool:
    """Whether a block can run in namespaces of its own here (unprivileged user namespaces allowed)."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        probe = subprocess.run([*NS_PREFIX, "sh", "-c", NS_SETUP + "true"], capture_output=True, timeout=30)
        return probe.returncode == 0
    return False


def _wrapper(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@dataclass(frozen=True)
class Ran:
    returncode: int | None  # None: killed at the time limit
    output: str
    seconds: float


def _kill_marked(marker: str) -> list[str]:
    """Kill every process whose environment carries this block's mark; their command lines."""
    killed = []
    for p in psutil.process_iter(["pid"]):
        with contextlib.suppress(psutil.Error):
            if p.environ().get(MARK) == marker and p.pid != os.getpid():
                killed.append(" ".join(p.cmdline()))
                p.kill()
    return killed


def run_block(block: Block, tmp: Path) -> Ran:
    clone, home, run, bin_dir = tmp / "clone", tmp / "home", tmp / "run", tmp / "bin"
    for d in (clone, home, bin_dir):
        d.mkdir(parents=True)
    run.mkdir(mode=0o700)
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in NOT_IN_A_CLONE \
                and not entry.name.endswith(".egg-info"):
            (clone / entry.name).symlink_to(entry)
    py = shlex.quote(sys.executable)
    _wrapper(bin_dir / "perfd", f'exec {py} -m perfd.app.cli "$@"')
    for name in ("python3", "python"):
        _wrapper(bin_dir / name, f'exec {py} "$@"')
    demo_venv = tmp / "demo-venv"  # what `make demo` would make: a venv with perfd in it
    (demo_venv / "bin").mkdir(parents=True)
    _wrapper(demo_venv / "bin" / "perfd", f'exec {py} -m perfd.app.cli "$@"')
    (demo_venv / ".installed").touch()
    marker = uuid.uuid4().hex
    # COLUMNS/LINES: a runner's terminal size would make `perfd top --once` print its compact form (no
    # iterations column) where a reader's redirected output gets the full one; the blocks run as read.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PERFD_", "XDG_", "KINETO_", "MAKE", "PYTEST_"))
           and k not in ("MFLAGS", "COLUMNS", "LINES")}
    env.update({"HOME": str(home), "XDG_STATE_HOME": str(home / ".local" / "state"),
                "XDG_RUNTIME_DIR": str(run), "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                "PYTHONPATH": str(ROOT), "DEMO_VENV": str(demo_venv), MARK: marker})
    script = tmp / "block.sh"
    script.write_text("set -e\n" + block.script + "\n" + LEFT_CHECK)
    argv = ([*NS_PREFIX, "sh", "-c", NS_SETUP + 'exec bash "$0"', str(script)] if namespaces()
            else ["bash", str(script)])
    log = tmp / "output.txt"
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=clone, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            left = _kill_marked(marker)
    text = log.read_text(errors="replace")
    if left:
        text += "\n[left running, killed: " + "; ".join(left) + "]"
    return Ran(rc, text, time.monotonic() - t0)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Ran]]:
    """Every runnable block, run once: at once where each has its own namespaces, else one by one."""
    base = tmp_path_factory.mktemp("readme")
    workers = len(RUNNABLE) if namespaces() else 1
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = {b.name: pool.submit(run_block, b, base / f"line{b.line}") for b in RUNNABLE}
        yield {name: f.result() for name, f in futures.items()}


def _top_rows(output: str) -> dict[str, int]:
    """`perfd top --once`'s job rows: job -> iterations seen."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"│ (\S+)(?: \*)? +│ +(\d+) │", output)}


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_the_block_runs(block: Block, ran: dict[str, Ran]) -> None:
    r = ran[block.name]
    where = f"{block.name} ({r.seconds:.0f} s)\n{block.script}\n--- output ---\n{r.output[-6000:]}"
    assert r.returncode is not None, f"still running after {BLOCK_TIMEOUT_S} s: {where}"
    assert r.returncode == 0, f"exit status {r.returncode}: {where}"
    assert "Traceback (most recent call last)" not in r.output, where
    assert "[left running" not in r.output, where
    if "perfd top" in block.script:  # a job the block streams is on the aggregator, with its steps
        rows = _top_rows(r.output)
        for job in re.findall(r"--job (\S+)", block.script):
            assert rows.get(job, 0) > 0, (job, rows, where)


def _perfd_argvs(script: str) -> list[list[str]]:
    """The ``perfd ...`` commands of a block, each as its argument list."""
    joined = re.sub(r"\\\n", " ", script)
    argvs = []
    for line in joined.splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lex.whitespace_split = True
        cmd: list[str] = []
        for tok in [*lex, ";"]:
            if tok and set(tok) <= set(";&|"):
                if cmd and cmd[0] == "perfd":
                    argvs.append(cmd[1:])
                cmd = []
            else:
                cmd.append(tok)
    return argvs


SKIPPED = [b for b in BLOCKS if b.needs is not None]


@pytest.mark.parametrize("block", SKIPPED, ids=[b.name for b in SKIPPED])
def test_a_block_this_machine_cannot_run_is_skipped_and_its_perfd_flags_exist(
        block: Block, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in _perfd_argvs(block.script):
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{block.name}: perfd {shlex.join(argv)}: {capsys.readouterr().err.strip()} ({exc})")
    pytest.skip(f"{block.name} needs {block.needs}")


def test_the_readme_has_shell_blocks_and_marks_only_before_them() -> None:
    text = README.read_text()
    assert len(RUNNABLE) >= 5, [b.name for b in BLOCKS]
    marks = [n for n, ln in enumerate(text.splitlines(), 1) if ln.strip().startswith("<!--")]
    assert all(NEEDS.match(text.splitlines()[n - 1].strip()) for n in marks), marks
    assert len(marks) == len(SKIPPED), "a needs mark that is not just before a shell block"


def test_the_blocks_are_read_as_the_readme_has_them() -> None:
    text = "\n".join(["intro", "<!-- needs: gpu -->", "", "```sh", "perfd a \\", "  --b", "```",
                      "```python", "x = 1", "```", "```console", "$ perfd c", "out", "$ perfd d &&",
                      "```", "```bash", "echo e", "```"])
    blocks = readme_blocks(text)
    assert [(b.line, b.lang, b.needs) for b in blocks] == [(4, "sh", "gpu"), (11, "console", None),
                                                           (16, "bash", None)]
    assert blocks[1].script == "perfd c\nperfd d &&"
    assert _perfd_argvs("perfd x --a 1 &  # c\nperfd y \\\n  --b 2 && perfd z | head\nls") == \
        [["x", "--a", "1"], ["y", "--b", "2"], ["z"]]
