"""What the aggregator process's memory is made of, read cheaply enough for every /api/stats: its RSS,
what the C allocator holds (in use, and free but not given back), and the Python objects' blocks.

An RSS that grows while the Python heap stays flat is memory the allocator keeps: freed blocks it has
not returned to the system (fragmentation), or native memory outside Python (gRPC, SQLite). glibc's
``mallinfo2`` tells the two apart: ``uordblks`` is what is allocated, ``fordblks`` what is free inside
its arenas. Linux and glibc only; elsewhere those figures are absent (never 0).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):  # not glibc (musl), or a glibc before 2.33
        return None
    return libc


_LIBC = _libc()


def rss_bytes() -> int | None:
    """The process's resident set (Linux: /proc/self/statm), None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    import resource

    return pages * resource.getpagesize()


def malloc_bytes() -> tuple[int, int] | None:
    """(bytes the C allocator has handed out, bytes free inside its arenas), None without glibc."""
    if _LIBC is None:
        return None
    mi = _LIBC.mallinfo2()
    return int(mi.uordblks + mi.hblkhd), int(mi.fordblks)


def trim() -> bool:
    """Give the allocator's free memory at the top of its heaps and in whole free pages back to the
    system (glibc ``malloc_trim(0)``); False where there is none to call. A call that found nothing to
    give back (malloc_trim's 0) is a call all the same: counted as one, it was not (``memory_trims``
    read 0 after three jobs pruned, once in a full suite)."""
    if _LIBC is None:
        return False
    _LIBC.malloc_trim(0)
    return True


def memory_stats() -> dict[str, int]:
    """What /api/stats shows of the process's memory; figures the platform does not give are absent."""
    out: dict[str, int] = {"python_blocks": sys.getallocatedblocks()}
    rss = rss_bytes()
    if rss is not None:
        out["rss_bytes"] = rss
    m = malloc_bytes()
    if m is not None:
        out["malloc_in_use_bytes"], out["malloc_free_bytes"] = m
    return out
