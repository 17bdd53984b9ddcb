"""The capture store: manifests, the quota check before a capture, pruning after one."""

from __future__ import annotations

import json
import threading

import pytest

from perfd.capture.store import MANIFEST, CaptureStore, CaptureStoreError, Manifest, safe_name


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def make(store: CaptureStore, nbytes: int, job: str = "j", status: str = "ok") -> Manifest:
    m = store.new_capture(job, [1, 0, 1], "kineto")
    f = store.capture_dir(m["id"]) / "rank0_123.json"
    f.write_bytes(b"x" * nbytes)
    store.add_artifact(m, f, "kineto_trace", 0, 123)
    return store.finish(m, status, None if status == "ok" else "why")


def test_manifest_fields_and_listing(tmp_path):
    store = CaptureStore(tmp_path / "caps", quota_bytes=10_000, clock=Clock())
    m = store.new_capture("job-a", [3, 1], "nsys", steps={"start": 10, "count": 3})
    assert m["status"] == "running" and m["ranks"] == [1, 3] and m["steps"] == {"start": 10, "count": 3}
    assert set(m["timings"]) == {"requested_at", "started_at", "first_event_at", "trace_ready_at",
                                 "finished_at"}
    on_disk = json.loads((store.capture_dir(m["id"]) / MANIFEST).read_text())
    assert on_disk["id"] == m["id"] and on_disk["job"] == "job-a"
    m["analysis"] = {"1": {"devices": []}}
    final = store.finish(m, "failed", "no trace")
    assert final["status"] == "failed" and final["reason"] == "no trace"
    assert final["timings"]["finished_at"] is not None
    m2 = make(store, 10, job="job-b")
    assert [x["id"] for x in store.list()] == [m2["id"], m["id"]]  # newest first
    assert [x["id"] for x in store.list(job="job-a")] == [m["id"]]
    assert m2["artifacts"][0]["bytes"] == 10 and m2["artifacts"][0]["rank"] == 0
    with pytest.raises(ValueError):
        store.finish(m2, "running")


def test_paths_must_stay_inside_the_store(tmp_path):
    store = CaptureStore(tmp_path / "caps", quota_bytes=100)
    m = store.new_capture("j", [0], "kineto")
    with pytest.raises(CaptureStoreError):
        store.add_artifact(m, tmp_path / "elsewhere.json", "x")
    with pytest.raises(CaptureStoreError):
        store.inside(store.root / ".." / "x")
    with pytest.raises(CaptureStoreError):
        store.capture_dir("../../etc")
    assert store.inside("a/b") == store.root / "a" / "b"
    assert safe_name("a b/../c") == "a_b_.._c" and safe_name("///") == "_"


def test_quota_refuses_before_and_prunes_oldest_after(tmp_path):
    store = CaptureStore(tmp_path / "caps", quota_bytes=1000, clock=Clock())
    assert store.check_quota() is None
    a = make(store, 400)
    b = make(store, 400)
    assert store.used_bytes() == 800
    assert store.check_quota() is None
    assert "quota" in (store.check_quota(estimate_bytes=300) or "")
    c = make(store, 400)  # 1200 > 1000: the oldest goes, its manifest stays
    assert store.used_bytes() == 800
    old = store.read(a["id"])
    assert old["artifacts"][0]["pruned"] is True and "pruned_at" in old
    assert not (store.capture_dir(a["id"]) / "rank0_123.json").exists()
    assert (store.capture_dir(a["id"]) / MANIFEST).exists()
    assert not store.read(b["id"])["artifacts"][0]["pruned"]
    assert not c["artifacts"][0]["pruned"]
    # A running capture is never pruned, even when it is the oldest.
    running = store.new_capture("j", [0], "kineto")
    (store.capture_dir(running["id"]) / "big").write_bytes(b"x" * 900)
    make(store, 10)
    assert (store.capture_dir(running["id"]) / "big").exists()
    assert store.read(b["id"])["artifacts"][0]["pruned"] and store.read(c["id"])["artifacts"][0]["pruned"]
    assert store.check_quota() is None or store.used_bytes() >= 1000


def test_full_store_refuses(tmp_path):
    store = CaptureStore(tmp_path / "caps", quota_bytes=100)
    running = store.new_capture("j", [0], "kineto")
    (store.capture_dir(running["id"]) / "t.json").write_bytes(b"x" * 150)
    reason = store.check_quota()
    assert reason is not None and "150 bytes of its 100-byte quota" in reason


def test_concurrent_captures_get_distinct_ids(tmp_path):
    store = CaptureStore(tmp_path / "caps", quota_bytes=10**6)
    ids: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        m = store.new_capture("j", [0], "kineto")
        with lock:
            ids.append(m["id"])

    threads = [threading.Thread(target=one) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 20 and len(store.list()) == 20


def test_bad_quota(tmp_path):
    with pytest.raises(ValueError):
        CaptureStore(tmp_path, quota_bytes=0)
