"""SYNTHETIC Flight Recorder dumps for tests: plain dicts pickled with the standard pickler.

The shape follows a real dump written by torch 2.13's C++ pickler (Gloo, CPU, captured here while
writing this module): keys, tuple ``process_group``, ``pg_config`` ranks as a string, ``pg_status``
keyed by pg uid. Real NCCL dumps from the GPU machine go to tests/data/ once recorded
(tests/gpu/make_nccl_fixtures.py).
"""

from __future__ import annotations

import pickle
from typing import Any

T0 = 1_800_000_000_000_000_000  # an epoch time in ns, arbitrary


def entry(seq: int, *, pg_id: int = 0, pg_name: str = "0", desc: str = "default_pg",
          op: str = "nccl:all_reduce", state: str = "completed", retired: bool = True,
          created_ns: int | None = None, duration_ms: float | None = None, p2p_seq: int = 0,
          is_p2p: bool = False, sizes: list[list[int]] | None = None, dtypes: list[str] | None = None,
          out_sizes: list[list[int]] | None = None, frames: list[dict[str, Any]] | None = None,
          record_id: int | None = None) -> dict[str, Any]:
    sizes = [[1024]] if sizes is None else sizes
    dtypes = ["Float"] * len(sizes) if dtypes is None else dtypes
    e: dict[str, Any] = {
        "record_id": seq if record_id is None else record_id, "pg_id": pg_id,
        "process_group": (pg_name, desc), "collective_seq_id": seq, "p2p_seq_id": p2p_seq,
        "op_id": seq, "profiling_name": op, "time_created_ns": T0 + seq * 1_000_000 if created_ns is None
        else created_ns,
        "input_sizes": sizes, "input_dtypes": dtypes,
        "output_sizes": sizes if out_sizes is None else out_sizes, "output_dtypes": dtypes,
        "state": state, "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None if state != "completed" else T0 + seq * 1_000_000 + 500,
        "retired": retired, "timeout_ms": 600000, "is_p2p": is_p2p,
        "frames": frames if frames is not None else [
            {"name": "all_reduce", "filename": "/x/site-packages/torch/distributed/distributed_c10d.py",
             "line": 3245},
            {"name": "train_step", "filename": "/job/train.py", "line": 42}],
        "thread_id": "1", "thread_name": "python",
    }
    if duration_ms is not None:
        e["duration_ms"] = duration_ms
    return e


def dump(entries: list[dict[str, Any]], ranks: str = "[0, 1]",
         extra_pgs: dict[str, dict[str, str]] | None = None,
         pg_status: dict[str, dict[str, int]] | None = None) -> dict[str, Any]:
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}
    cfg.update(extra_pgs or {})
    return {"version": "2.10", "comm_lib_version": "2.28.9", "pg_config": cfg,
            "pg_status": pg_status or {}, "entries": entries}


def pickled(obj: Any, protocol: int = 2) -> bytes:
    return pickle.dumps(obj, protocol=protocol)
