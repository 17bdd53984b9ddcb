"""A collector's checkpoint against the spool (perfd.agent.checkpoints): a kill -9 between the
checkpoint file and the spool, or after both, neither loses nor repeats a record; a batch the disk
refused holds the position back; the first file format still resumes. The "kill" is what a restart
sees: the files on disk, a new Spool and Checkpoints opened on them."""

from __future__ import annotations

import errno
import json
from pathlib import Path

from perfd.agent.checkpoints import MAX_PENDING, Checkpoints
from perfd.transport.spool import Spool


def _pos(offset: int) -> dict[str, object]:
    return {"position": {"offset": offset}}


def _submit(sp: Spool, ck: Checkpoints, offset: int, append: bool = True) -> int:
    """What the agent does per batch: the position pends on the seq, then the batch enters the spool
    (``append=False``: killed in between)."""
    seq = sp.next_seq()
    ck.save("megatron", _pos(offset), seq)
    if append:
        sp.append(seq, b"batch-%d" % seq)
    return seq


def _restart(tmp_path: Path) -> tuple[Spool, Checkpoints, dict[str, object] | None]:
    sp = Spool(tmp_path / "spool")
    ck = Checkpoints(tmp_path / "state", settled=sp.settled)
    return sp, ck, ck.load("megatron")


def test_a_kill_after_the_spool_resumes_past_the_batch_one_before_it_resumes_before(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "spool")
    ck = Checkpoints(tmp_path / "state", settled=sp.settled)
    _submit(sp, ck, 100)
    _submit(sp, ck, 200)
    sp.close()
    sp, ck, at = _restart(tmp_path)
    assert at == _pos(200)  # both batches on disk: nothing is read again
    _submit(sp, ck, 300, append=False)  # killed after the file, before the spool
    sp.close()
    assert _restart(tmp_path)[2] == _pos(200)  # that batch never existed: its records are read again


def test_positions_fold_into_the_base_as_batches_settle(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "spool")
    ck = Checkpoints(tmp_path / "state", settled=sp.settled)
    path = tmp_path / "state" / "megatron.checkpoint.json"
    for off in (100, 200):
        _submit(sp, ck, off)
    seq = _submit(sp, ck, 300, append=False)  # the file as it is while batch 3 enters the spool
    assert json.loads(path.read_text()) == {"format": 2, "base": _pos(200), "pending": [[seq, _pos(300)]]}
    ck.save("megatron", _pos(350))  # lines that made nothing to send: they ride on batch 3, unsafe yet
    assert json.loads(path.read_text())["pending"] == [[seq, _pos(350)]]
    sp.append(seq, b"batch-3")
    ck.save("megatron", _pos(360))  # batch 3 on disk: everything folds into the base
    assert json.loads(path.read_text()) == {"format": 2, "base": _pos(360), "pending": []}


def test_a_batch_the_disk_refused_holds_the_position_back(tmp_path: Path) -> None:
    sp = Spool(tmp_path / "spool")
    ck = Checkpoints(tmp_path / "state", settled=sp.settled)
    _submit(sp, ck, 100)

    def enospc(fd: int, data: bytes | memoryview) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    sp._os_write = enospc  # type: ignore[method-assign]
    held = _submit(sp, ck, 200)  # kept in memory only
    assert not sp.settled(held) and sp.settled(held - 1)
    _submit(sp, ck, 300)
    sp.close()
    # Killed with two batches in memory: the restart reads their records again from 100.
    assert _restart(tmp_path)[2] == _pos(100)


def test_an_in_memory_spool_resumes_only_past_what_the_aggregator_acknowledged(tmp_path: Path) -> None:
    sp = Spool(None)
    ck = Checkpoints(tmp_path / "state", settled=sp.settled)
    a = _submit(sp, ck, 100)
    _submit(sp, ck, 200)
    sp.ack(a)
    ck.save("megatron", _pos(250))
    fresh = Checkpoints(tmp_path / "state", settled=Spool(None).settled)
    assert fresh.load("megatron") == _pos(100)


def test_pending_positions_are_bounded_and_a_restart_never_skips(tmp_path: Path) -> None:
    sp = Spool(None)  # nothing settles until acknowledged
    ck = Checkpoints(tmp_path / "state", settled=sp.settled)
    seqs = [_submit(sp, ck, 100 * (i + 1)) for i in range(MAX_PENDING + 10)]
    doc = json.loads((tmp_path / "state" / "megatron.checkpoint.json").read_text())
    assert len(doc["pending"]) == MAX_PENDING and doc["pending"][0][0] == seqs[0]
    sp.ack(seqs[5])  # the first six acknowledged: the base may move only as far as what is on file
    ck.save("megatron", _pos(99_999), None)
    doc = json.loads((tmp_path / "state" / "megatron.checkpoint.json").read_text())
    assert doc["base"] == _pos(100)  # seq 1's; 2-6 were dropped from the middle: never further


def test_a_first_format_file_is_its_base(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir(mode=0o700)
    (tmp_path / "state" / "megatron.checkpoint.json").write_text(json.dumps(_pos(42)))
    assert _restart(tmp_path)[2] == _pos(42)
