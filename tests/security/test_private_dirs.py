"""perfd's own folders (captures, spool, agent and aggregator state) are private: another local
user can neither hand perfd a folder of theirs nor lead a root agent's pruning outside its store."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from perfd.agent.checkpoints import Checkpoints
from perfd.agent.config import AgentConfig
from perfd.aggregator.state_schema import StoreError
from perfd.aggregator.state_store import StateStore
from perfd.capture.nsys_exec import default_capture_root
from perfd.capture.store import MANIFEST, CaptureStore
from perfd.core.privdir import UnsafeDirError, private_dir, rmtree_at
from perfd.transport.spool import Spool
from tests.security.other_user import other_user

CAPTURE_ID = "c20250101-000000-abcdef"


def _victim(root: Path) -> Path:
    """What a root agent must never delete: a file and a folder outside any capture store."""
    target = root / "target"
    (target / "subdir").mkdir(parents=True)
    (target / "important.txt").write_text("keep me\n")
    (target / "subdir" / "data.bin").write_bytes(b"x" * 4096)
    # A manifest, so the folder passes for a finished capture to code that follows the link.
    (target / MANIFEST).write_text(json.dumps({"id": CAPTURE_ID, "job": "j", "status": "ok",
                                               "timings": {"finished_at": 1.0, "requested_at": 1.0},
                                               "artifacts": []}))
    return target


def _fill_over_quota(store: CaptureStore) -> None:
    m = store.new_capture("j", [0], "kineto")
    (store.capture_dir(m["id"]) / "rank0.json").write_bytes(b"y" * 2000)
    store.finish(m, "ok")


def test_capture_store_refuses_a_folder_another_user_made_first(shared_tmp: Path) -> None:
    other = other_user()
    target = _victim(shared_tmp / "root-owned")
    squatted = shared_tmp / "perfd-captures"
    # The other user makes the store's folder first, world-writable, with a capture folder that
    # is a link to the root's files (the attack of the issue, in a process of that user).
    other.run('mkdir -m 777 "$1" && ln -s "$2" "$1/$3"', str(squatted), str(target), CAPTURE_ID)
    assert squatted.stat().st_uid == other.uid
    with pytest.raises(UnsafeDirError, match=f"belongs to uid {other.uid}"):
        store = CaptureStore(squatted, quota_bytes=1000)
        _fill_over_quota(store)  # what the old store did next: prune through the link
    assert (target / "important.txt").read_text() == "keep me\n"
    assert (target / "subdir" / "data.bin").stat().st_size == 4096


@pytest.mark.parametrize("make", [
    lambda p: Spool(p), lambda p: Checkpoints(p), lambda p: StateStore(p),
    lambda p: CaptureStore(p, quota_bytes=10),
], ids=["spool", "agent-state", "aggregator-state", "captures"])
def test_each_private_folder_refuses_another_users_folder(shared_tmp: Path, make) -> None:
    other = other_user()
    squatted = shared_tmp / "squatted"
    other.run('mkdir -m 777 "$1"', str(squatted))
    with pytest.raises((UnsafeDirError, StoreError), match=f"uid {other.uid}"):
        make(squatted)
    assert os.listdir(squatted) == []  # nothing written into it


def test_a_folder_under_another_users_folder_is_refused(shared_tmp: Path) -> None:
    other = other_user()
    theirs = shared_tmp / "theirs"
    other.run('mkdir -m 755 "$1"', str(theirs))
    with pytest.raises(UnsafeDirError, match="could swap"):
        private_dir(theirs / "captures")  # they could rename "captures" to a link of theirs
    assert not (theirs / "captures").exists()


def test_prune_never_follows_a_symlinked_capture_folder(tmp_path: Path) -> None:
    target = _victim(tmp_path)
    store = CaptureStore(tmp_path / "caps", quota_bytes=1000)
    (store.root / CAPTURE_ID).symlink_to(target)
    # And links inside a real capture folder: removed as links, what they name is left alone.
    m = store.new_capture("j", [0], "kineto")
    d = store.capture_dir(m["id"])
    (d / "trace").mkdir()
    (d / "trace" / "to-target").symlink_to(target)
    (d / "to-file").symlink_to(target / "important.txt")
    (d / "rank0.json").write_bytes(b"y" * 2000)
    store.finish(m, "ok")  # over quota: prunes
    assert (target / "important.txt").read_text() == "keep me\n"
    assert (target / "subdir" / "data.bin").stat().st_size == 4096
    assert sorted(os.listdir(d)) == [MANIFEST]
    assert store.read(m["id"])["pruned_at"] is not None
    assert CAPTURE_ID not in {c["id"] for c in store.list()}  # a link is no capture of ours


def test_private_dir_made_0700_and_a_wider_one_of_ours_narrowed(tmp_path: Path) -> None:
    made = private_dir(tmp_path / "a" / "b")
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700  # parents made private too
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    wide.chmod(0o777)
    private_dir(wide)
    assert stat.S_IMODE(wide.stat().st_mode) == 0o700


def test_private_dir_refuses_a_link_and_an_open_ancestor(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(UnsafeDirError, match="symbolic link"):
        private_dir(tmp_path / "link")
    # A link of ours among the ancestors is followed (as /var/run → /run is).
    assert private_dir(tmp_path / "link" / "sub").exists() and (real / "sub").is_dir()
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # writable by all, no sticky bit
    with pytest.raises(UnsafeDirError, match="without the sticky bit"):
        private_dir(open_dir / "x")
    open_dir.chmod(0o1777)  # sticky, like /tmp: fine
    assert private_dir(open_dir / "x").is_dir()


def test_rmtree_at_deletes_links_not_what_they_name(tmp_path: Path) -> None:
    target = _victim(tmp_path)
    tree = tmp_path / "tree"
    (tree / "deep").mkdir(parents=True)
    (tree / "deep" / "l").symlink_to(target)
    (tree / "f").write_bytes(b"z" * 10)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert rmtree_at(fd, "tree") == 10
    finally:
        os.close(fd)
    assert not tree.exists() and (target / "important.txt").exists()


def test_default_capture_folder_is_per_user_not_a_shared_tmp_name(tmp_path: Path) -> None:
    root = default_capture_root()
    assert root.name == "captures" and "perfd-captures" not in str(root)
    assert str(os.geteuid()) in str(root) or not str(root).startswith("/tmp/")
    assert AgentConfig(state_dir=str(tmp_path)).capture_root() == str(tmp_path / "captures")
    assert AgentConfig(capture_dir="/x", state_dir=str(tmp_path)).capture_root() == "/x"


def test_a_store_root_swapped_for_a_link_is_not_pruned(tmp_path: Path) -> None:
    target = _victim(tmp_path)
    store = CaptureStore(tmp_path / "caps", quota_bytes=1000)
    m = store.new_capture("j", [0], "kineto")
    (store.capture_dir(m["id"]) / "rank0.json").write_bytes(b"y" * 2000)
    moved = tmp_path / "caps-moved"
    (tmp_path / "caps").rename(moved)
    (tmp_path / "caps").symlink_to(target)  # the root's name now leads elsewhere
    assert store.prune() == [] and store.prune_refusals == 1
    assert (target / "important.txt").exists() and (moved / m["id"] / "rank0.json").exists()
