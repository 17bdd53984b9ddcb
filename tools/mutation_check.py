"""The mutation spot-check: one comparison changed in each of the stall watch, incident detection and
the record codec (and the stall watch's limit at its boundary) must fail the tests that cover that
module.

    python tools/mutation_check.py              # every mutation (make mutation-check)
    python tools/mutation_check.py --only codec --json

The working tree is never edited: its files (git's tracked and untracked-but-not-ignored ones, as
`git ls-files` lists them) are copied to a temporary folder; each mutation is applied there, its tests
run there (PYTHONPATH names the copy, so perfd processes the tests start run the mutated code too),
and the file is put back before the next. Each test set first runs on the unchanged copy: a set that
fails there proves nothing, and is an error. A mutation is "killed" when its tests fail (or time out)
and "survived" when they pass; the exit status is 1 if any survived, 2 for an error (a snippet no
longer in its file, or found more than once: the code drifted and the mutation must be rewritten).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the checkout
    original: str  # must occur exactly once in the file
    replacement: str
    what: str  # what the changed code would do
    tests: tuple[str, ...]  # the test files that cover the module (their imports name it)


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "stall",
        "perfd/analytics/incidents/stall.py",
        "    if silent <= limit:\n",
        "    if silent > limit:\n",
        "the stall watch takes a job silent past its limit for a running one, and a running one for stalled",
        ("tests/host/test_stall_aggregator.py", "tests/host/test_stall_capture.py",
         "tests/host/test_stall_restart.py", "tests/analytics/test_host_evidence.py",
         "tests/security/test_stall_holds.py"),
    ),
    Mutation(
        "stall-limit",
        "perfd/analytics/incidents/stall.py",
        "    if silent <= limit:\n",
        "    if silent < limit:\n",
        "a job silent for exactly its limit is taken for stalled (it stalls only past the limit)",
        ("tests/analytics/test_host_evidence.py",),
    ),
    Mutation(
        "incident",
        "perfd/analytics/incidents/detect.py",
        "mean > STEP_FACTOR * level and step > level:",
        "mean < STEP_FACTOR * level and step > level:",
        "a slow stretch is flagged where the rolling mean is below the bar, not above it",
        ("tests/analytics/test_incidents.py", "tests/incidents/test_split_stretch.py",
         "tests/incidents/test_merged_stretch.py", "tests/analytics/test_changepoint.py",
         "tests/incidents/test_tracked_records.py"),
    ),
    Mutation(
        "codec",
        "perfd/transport/record_codec.py",
        "if m.pg_ranks_index >= len(rank_lists):",
        "if m.pg_ranks_index > len(rank_lists):",
        "a collective record naming the rank list one past the batch's table is not refused as malformed",
        ("tests/transport/test_transport_codec.py", "tests/transport/test_transport_collectives.py",
         "tests/test_event_types.py", "tests/test_mfu_path.py"),
    ),
)


class MutationError(Exception):
    """The check cannot say anything: a snippet drifted, or a test set fails unchanged."""


@dataclass
class Outcome:
    name: str
    where: str  # path:line of the change
    status: str  # "killed", "survived"
    failed: list[str]  # the tests that failed (pytest's node ids)
    seconds: float
    timed_out: bool = False


def locate(m: Mutation, root: Path) -> int:
    """The line the snippet starts on; MutationError unless it occurs exactly once."""
    path = root / m.path
    if not path.is_file():
        raise MutationError(f"mutation {m.name!r}: {m.path} does not exist")
    text = path.read_text()
    n = text.count(m.original)
    if n != 1:
        found = "not found" if n == 0 else f"found {n} times"
        raise MutationError(f"mutation {m.name!r}: the snippet {m.original!r} is {found} in {m.path}: "
                            "the code changed; rewrite the mutation")
    for t in m.tests:
        if not (root / t).is_file():
            raise MutationError(f"mutation {m.name!r}: its test file {t} does not exist")
    return text[:text.index(m.original)].count("\n") + 1


def source_files(root: Path) -> list[str]:
    """The checkout's files as git sees them: tracked, and untracked ones it does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, check=True, capture_output=True).stdout
    return [p for p in out.decode().split("\0") if p]


def copy_tree(root: Path, dest: Path) -> None:
    for rel in source_files(root):
        src = root / rel
        if src.is_dir() and not src.is_symlink():
            continue  # a nested repository (a submodule) git lists as one path
        if not os.path.lexists(src):
            continue  # deleted in the working tree, not yet in git
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)


def run_tests(tree: Path, tests: tuple[str, ...], python: str, pycache: Path, timeout_s: float
              ) -> tuple[int | None, str, float]:
    """pytest over ``tests`` in ``tree``: (exit status or None for a timeout, its output, seconds).
    Each run has its own bytecode cache: a mutation of the same size as the original, written in the
    same second, would otherwise be read back as the original's bytecode."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "--no-header", *tests]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    return rc, out, time.monotonic() - t0


def failed_tests(output: str) -> list[str]:
    return sorted({m.group(2) for m in re.finditer(r"^(FAILED|ERROR) (\S+)", output, re.M)})


def check_imports_copy(tree: Path, python: str) -> None:
    """The tests' perfd must be the copy's, not the checkout an editable install points at."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    got = subprocess.run([python, "-c", "import perfd, perfd.collectors; print(perfd.__file__); "
                          "print(perfd.collectors.__file__)"],
                         cwd=tree, env=env, capture_output=True, text=True)
    files = got.stdout.split()
    if got.returncode != 0 or len(files) != 2 or not all(Path(f).resolve().is_relative_to(tree.resolve())
                                                         for f in files):
        raise MutationError(f"the copy's perfd is not the one imported ({got.stdout.strip()} "
                            f"{got.stderr.strip()[-300:]})")


def check(mutations: list[Mutation], python: str, timeout_s: float, log: bool = True) -> list[Outcome]:
    lines = {m.name: locate(m, ROOT) for m in mutations}  # every snippet checked before anything runs
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="perfd-mutation-") as tmp:
        tree = Path(tmp) / "tree"
        copy_tree(ROOT, tree)
        check_imports_copy(tree, python)
        for m in mutations:
            locate(m, tree)
            rc, out, secs = run_tests(tree, m.tests, python, Path(tmp) / f"pyc-{m.name}-base", timeout_s)
            if rc != 0:
                tail = "\n".join(out.splitlines()[-30:])
                raise MutationError(f"mutation {m.name!r}: its tests fail on the unchanged code "
                                    f"(exit {rc}, {secs:.0f} s):\n{tail}")
            path = tree / m.path
            original = path.read_text()
            path.write_text(original.replace(m.original, m.replacement, 1))
            try:
                rc, out, secs = run_tests(tree, m.tests, python, Path(tmp) / f"pyc-{m.name}", timeout_s)
            finally:
                path.write_text(original)
            failed = failed_tests(out)
            o = Outcome(m.name, f"{m.path}:{lines[m.name]}", "survived" if rc == 0 else "killed", failed,
                        round(secs, 1), timed_out=rc is None)
            outcomes.append(o)
            if log:
                print(describe(m, o), flush=True)
    return outcomes


def describe(m: Mutation, o: Outcome) -> str:
    change = f"{m.original.strip()!r} -> {m.replacement.strip()!r}"
    head = f"{o.name}: {o.status.upper()} ({o.where}: {change}; {o.seconds:.0f} s)"
    if o.timed_out:
        return head + "\n  the tests timed out"
    if o.status == "survived":
        return head + f"\n  {m.what}: and {len(m.tests)} test files still pass ({', '.join(m.tests)})"
    return head + "".join(f"\n  failed: {t}" for t in o.failed[:12]) + (
        f"\n  ... and {len(o.failed) - 12} more" if len(o.failed) > 12 else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--only", action="append", choices=[m.name for m in MUTATIONS],
                    help="this mutation only (repeatable)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter the tests run on")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a test run may take")
    ap.add_argument("--json", action="store_true", help="the outcomes as JSON on stdout")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path}: {m.original.strip()!r} -> {m.replacement.strip()!r}\n  {m.what}"
                  f"\n  tests: {' '.join(m.tests)}")
        return 0
    try:
        outcomes = check(chosen, args.python, args.timeout, log=not args.json)
    except MutationError as exc:
        print(f"mutation check: {exc}", file=sys.stderr)
        return 2
    survived = [o.name for o in outcomes if o.status == "survived"]
    if args.json:
        print(json.dumps([o.__dict__ for o in outcomes], indent=2))
    else:
        killed = len(outcomes) - len(survived)
        print(f"== {len(outcomes)} mutations: {killed} killed, {len(survived)} survived"
              + (f" ({', '.join(survived)})" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
