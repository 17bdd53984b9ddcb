"""`perfd launch --log/--run-dir/--manifest` in a folder another user may write in:
root's launch must never write through a link or over a file that user planted, and says so before
the job starts (exit 2, one line). Each attack runs in a real process of a second OS user."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from perfd.app.cli import main
from perfd.app.launcher import LaunchOptions, run_launch
from tests.security.other_user import OtherUser, other_user

pytestmark = pytest.mark.timeout(60)
SECRET = b"root's secret, mode 0600\n"


def _victims(tmp_path: Path) -> tuple[Path, Path]:
    """Two root-owned 0600 files the planted links point at."""
    out = []
    for name in ("shadow-a", "shadow-b"):
        p = tmp_path / name
        p.write_bytes(SECRET)
        p.chmod(0o600)
        out.append(p)
    return out[0], out[1]


def _launch(tmp_path: Path, **kw: str) -> tuple[int, str, Path]:
    """``perfd launch`` of a command that leaves a mark when it runs; (exit status, stderr, the mark)."""
    mark = tmp_path / "job-ran"
    err = io.StringIO()
    kw.setdefault("run_dir", str(tmp_path / "run"))
    opts = LaunchOptions(command=["--", sys.executable, "-c",
                                  f"open({str(mark)!r}, 'w').close(); print('job output line')"],
                         job="t", agent_socket=str(tmp_path / "h.sock"), **kw)  # type: ignore[arg-type]
    rc = run_launch(opts, terminal=io.BytesIO(), err=err)
    return rc, err.getvalue(), mark


def _refused(rc: int, err: str, mark: Path, *words: str) -> None:
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err  # one line for a person
    for w in words:
        assert w in err, err
    assert not mark.exists(), "the job started"


def test_log_and_times_links_planted_by_another_user_are_not_followed(tmp_path: Path,
                                                                      shared_tmp: Path) -> None:
    """The issue's attack: train.log and train.log.times links to two root-owned 0600 files, in a
    shared 1777 folder (root's, as /tmp): root's launch refuses, both files keep their content."""
    other = other_user()
    a, b = _victims(tmp_path)
    log = shared_tmp / "train.log"
    other.run('ln -s "$1" "$3" && ln -s "$2" "$3.times"', str(a), str(b), str(log))
    rc, err, mark = _launch(tmp_path, log=str(log))
    _refused(rc, err, mark, str(log), "symbolic link")
    assert a.read_bytes() == SECRET and b.read_bytes() == SECRET
    # The .times link alone: refused too, and the log (a new file) left untouched as well.
    os.unlink(log)
    rc, err, mark = _launch(tmp_path, log=str(log))
    _refused(rc, err, mark, f"{log}.times", "symbolic link")
    assert b.read_bytes() == SECRET and log.read_bytes() == b""


def test_a_log_folder_of_another_user_is_refused(tmp_path: Path, shared_tmp: Path) -> None:
    """A 1777 folder the other user owns: they may rename and delete what is in it (ours included),
    so root writes nothing there, links or not."""
    other = other_user()
    folder = shared_tmp / "scratch"
    other.run('mkdir -m 1777 "$1"', str(folder))
    rc, err, mark = _launch(tmp_path, log=str(folder / "train.log"))
    _refused(rc, err, mark, "--log", f"belongs to uid {other.uid}")
    assert not (folder / "train.log").exists()


def test_a_planted_regular_file_and_a_hard_link_are_not_overwritten(tmp_path: Path, shared_tmp: Path) -> None:
    """A file the other user made (they would read the job's output in it) and a second name of a
    root file (a hard link, as fs.protected_hardlinks=0 lets any user make) are refused."""
    other = other_user()
    log = shared_tmp / "train.log"
    other.run('echo theirs > "$1" && chmod 666 "$1"', str(log))
    rc, err, mark = _launch(tmp_path, log=str(log))
    _refused(rc, err, mark, f"belongs to uid {other.uid}")
    assert log.read_text() == "theirs\n"
    a, _ = _victims(tmp_path)
    log2 = shared_tmp / "second.log"
    os.link(a, log2)
    rc, err, mark = _launch(tmp_path, log=str(log2))
    _refused(rc, err, mark, "2 hard links")
    assert a.read_bytes() == SECRET


def test_run_dir_and_manifest_in_a_folder_others_write_in_are_refused(tmp_path: Path,
                                                                      shared_tmp: Path) -> None:
    """--run-dir (the log, the manifest and its temporary file, Kineto's config go there) must be the
    user's own folder, closed to others; a 1777 folder is refused, whoever owns it, as is a folder
    under another user's. --manifest likewise."""
    other: OtherUser = other_user()
    theirs = shared_tmp / "theirs"
    other.run('mkdir -m 1777 "$1"', str(theirs))
    theirs_said = f"belongs to uid {other.uid}"
    for run_dir, why in ((theirs, theirs_said), (theirs / "run", theirs_said),
                         (shared_tmp, "writable by other users")):
        rc, err, mark = _launch(tmp_path, run_dir=str(run_dir))
        _refused(rc, err, mark, "--run-dir", why)
    assert not (theirs / "run").exists() and not (theirs / "output.log").exists()
    rc, err, mark = _launch(tmp_path, manifest=str(shared_tmp / "launch.json"))
    _refused(rc, err, mark, "--manifest", "writable by other users")


def test_a_flight_recorder_folder_linked_or_shared_by_another_user_is_refused(tmp_path: Path,
                                                                               shared_tmp: Path) -> None:
    """--flight-recorder DIR: the job's dumps (stacks among them) and the agent's trigger pipes go
    there. A link another user planted at the name was resolved and followed (root's job then wrote
    where they chose, and root made the folder they named); their 1777 folder was taken. Both are
    refused before the job starts, and nothing is made where the link points."""
    other: OtherUser = other_user()
    mine = tmp_path / "root-only"
    mine.mkdir(mode=0o700)
    link = shared_tmp / "fr"
    other.run('ln -s "$1" "$2"', str(mine / "made"), str(link))
    rc, err, mark = _launch(tmp_path, flight_recorder=str(link))
    _refused(rc, err, mark, "--flight-recorder", "symbolic link")
    assert not (mine / "made").exists()
    theirs = shared_tmp / "theirs-fr"
    other.run('mkdir -m 1777 "$1"', str(theirs))
    rc, err, mark = _launch(tmp_path, flight_recorder=str(theirs))
    _refused(rc, err, mark, "--flight-recorder", f"belongs to uid {other.uid}")
    rc, err, mark = _launch(tmp_path, flight_recorder=str(tmp_path / "fr"))  # our own: made 0700, used
    assert rc == 0, err
    assert mark.exists() and (tmp_path / "fr").stat().st_mode & 0o777 == 0o700


def test_a_log_of_ours_is_reused_and_a_new_run_dir_is_private(tmp_path: Path, shared_tmp: Path) -> None:
    """What stays as it was: an existing log and sidecar of ours are truncated and written again,
    a log in root's 1777 folder (as /tmp) is made there, a new run folder is made 0700."""
    log = shared_tmp / "mine.log"
    log.write_bytes(b"old run\n" * 100)
    Path(f"{log}.times").write_bytes(b"1 1\n" * 100)
    rc, err, _ = _launch(tmp_path, log=str(log))
    assert rc == 0, err
    assert log.read_bytes() == b"job output line\n"
    assert len(Path(f"{log}.times").read_text().splitlines()) == 1
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700
    fresh = shared_tmp / "fresh.log"
    rc, err, _ = _launch(tmp_path, log=str(fresh))
    assert rc == 0 and fresh.read_bytes() == b"job output line\n", err


def test_the_command_exits_2_with_one_line(tmp_path: Path, shared_tmp: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """`perfd launch` as a person runs it: exit 2, one line on stderr, the job not started."""
    other = other_user()
    a, b = _victims(tmp_path)
    log = shared_tmp / "train.log"
    other.run('ln -s "$1" "$3" && ln -s "$2" "$3.times"', str(a), str(b), str(log))
    mark = tmp_path / "ran"
    rc = main(["launch", "--log", str(log), "--run-dir", str(tmp_path / "run"), "--agent-socket",
               str(tmp_path / "h.sock"), "--", sys.executable, "-c", f"open({str(mark)!r}, 'w')"])
    err = capsys.readouterr().err
    assert rc == 2 and not mark.exists()
    assert err.strip().splitlines() == [f"perfd launch: --log: {log} is a symbolic link: refusing to write "
                                        "through it (remove it, or name another file)"]
    assert a.read_bytes() == SECRET and b.read_bytes() == SECRET
