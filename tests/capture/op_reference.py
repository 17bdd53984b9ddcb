"""An independent op-level count of a Kineto trace with Python stacks: the reference perfd's op
attribution (perfd.capture.ops) is checked against. Written apart from perfd's code and on other
evidence, so that a shared mistake is unlikely:

- a GPU event finds its op through the ``External id`` both carry (perfd: the correlation id of the
  runtime call and the time it ran at);
- a backward op finds its forward op through autograd's ``Sequence number`` (perfd: the ``fwdbwd``
  flow events);
- the part comes from the ``nn.Module`` frames around the forward op and the Python functions of
  the loss and the optimizer (perfd's default: op names and runs of sibling ops), and, for autograd
  nodes with no forward op of their own, from the tensors they work on: an op on a tensor whose
  last two sides are the sequence length (``[batch, heads, s, s]``, ``[batch·heads, s, s]``) is core
  attention's (the scores or the probabilities).

Time is summed per event (kernels, copies, memsets), not exclusive: on one compute stream the two
agree to within the overlap of copies and collectives, which the comparison states.

    python3 tests/capture/op_reference.py TRACE.json.gz   # prints ms per step by part
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from typing import Any

MODULE = re.compile(r"^nn\.Module: ([A-Za-z0-9_]+?)(?:_\d+)?$")


def _load(path: str) -> list[dict[str, Any]]:
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return list(json.loads(raw)["traceEvents"])


def _square4(dims: Any) -> bool:
    """A 4-d tensor whose last two sides are equal (and more than one): [batch, heads, s, s]."""
    return _square(dims) and len(dims) == 4


def _square(dims: Any) -> bool:
    """A tensor of 3 or more dimensions whose last two sides are equal and more than one."""
    return (isinstance(dims, list) and len(dims) >= 3 and all(isinstance(d, int) for d in dims)
            and dims[-1] == dims[-2] and dims[-1] > 1)


def _module_part(cls: str) -> str | None:
    c = cls.lower()
    if c in ("dotproductattention", "fusedscalemasksoftmax", "coreattention", "tedotproductattention"):
        return "attention"
    if c.endswith("linear"):
        return "linear"
    if c.endswith("norm"):
        return "norm"
    if c.endswith("embedding"):
        return "embedding"
    if c == "mlp":
        return "activation"
    return None


def _function_part(name: str) -> str | None:
    path, _, func = name.partition("): ")
    if "cross_entropy" in path or "loss" in func:
        return "loss"
    if "/optimizer/" in path:
        return "optimizer"
    return None


class Reference:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.ops: dict[int, dict[str, Any]] = {}  # External id -> cpu_op
        self.by_tid: dict[int, list[dict[str, Any]]] = defaultdict(list)  # ops, annotations, frames
        self.gpu: list[dict[str, Any]] = []
        for e in events:
            cat = e.get("cat")
            if e.get("ph") != "X":
                continue
            if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
                self.gpu.append(e)
            elif cat in ("cpu_op", "user_annotation", "python_function"):
                self.by_tid[int(e["tid"])].append(e)
                if cat == "cpu_op" and "External id" in e.get("args", {}):
                    self.ops[e["args"]["External id"]] = e
        for evs in self.by_tid.values():
            evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        # the enclosing events of every event, by a containment scan per thread
        self.enclosing: dict[int, list[dict[str, Any]]] = {}
        for evs in self.by_tid.values():
            open_: list[dict[str, Any]] = []
            for e in evs:
                open_ = [o for o in open_ if o["ts"] + o["dur"] >= e["ts"] + e["dur"] - 0.002]
                self.enclosing[id(e)] = list(open_)
                open_.append(e)
        self.forward_by_seq: dict[int, dict[str, Any]] = {}
        for e in self.ops.values():
            seq = e.get("args", {}).get("Sequence number")
            if seq is not None and not self._backward_node(e):
                self.forward_by_seq.setdefault(seq, e)
        self.seq_len = self._seq_len()

    def _seq_len(self) -> int | None:
        """The sequence length: the side of the largest square trailing pair in any op's input."""
        best = None
        for e in self.ops.values():
            for dims in e.get("args", {}).get("Input Dims") or []:
                if _square4(dims):
                    best = max(best or 0, dims[-1])
        return best

    def _backward_node(self, e: dict[str, Any]) -> str | None:
        for o in [*self.enclosing.get(id(e), []), e]:
            if o["name"].startswith("autograd::engine::evaluate_function: "):
                return str(o["name"].split(": ", 1)[1])
        return None

    def _forward_part(self, e: dict[str, Any]) -> str | None:
        chain = [*self.enclosing.get(id(e), []), e]
        if any(o["name"].startswith("Optimizer.") for o in chain):
            return "optimizer"
        for o in reversed(chain):  # innermost frame first
            if o.get("cat") != "python_function":
                continue
            m = MODULE.match(o["name"])
            part = _module_part(m.group(1)) if m else _function_part(o["name"])
            if part:
                return part
        return None

    def _attention_shape(self, e: dict[str, Any]) -> bool:
        s = self.seq_len
        for o in [*self.enclosing.get(id(e), []), e]:
            for dims in o.get("args", {}).get("Input Dims") or []:
                if _square(dims) and dims[-1] == s:
                    return True
        return False

    def part(self, g: dict[str, Any]) -> str:
        op = self.ops.get(g.get("args", {}).get("External id"))
        if "nccl" in g["name"].lower():
            return "communication"
        if op is None:
            return "unlinked"
        node = self._backward_node(op)
        if node is None:
            got = self._forward_part(op)
        elif "AccumulateGrad" in node:
            got = "grad_reduce"
        else:
            seqs = [o.get("args", {}).get("Sequence number") for o in [*self.enclosing.get(id(op), []), op]]
            fwd = next((self.forward_by_seq[s] for s in seqs if s in self.forward_by_seq), None)
            got = self._forward_part(fwd) if fwd is not None else None
        if got is None and self._attention_shape(op):
            got = "attention"
        return got or "other"

    def totals_ms(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for g in self.gpu:
            out[self.part(g)] += g["dur"] / 1e3
        return dict(out)

    def span_ms(self) -> float:
        return float(max(g["ts"] + g["dur"] for g in self.gpu) - min(g["ts"] for g in self.gpu)) / 1e3


def main() -> int:
    ref = Reference(_load(sys.argv[1]))
    steps = sum(1 for evs in ref.by_tid.values() for e in evs if e["name"].startswith("Optimizer.step#"))
    n = steps or 1
    tot = ref.totals_ms()
    print(f"span {ref.span_ms() / n:.1f} ms per step over {n} steps; seq length {ref.seq_len}")
    for part, ms in sorted(tot.items(), key=lambda kv: -kv[1]):
        print(f"  {part:14s} {ms / n:8.1f} ms  {ms / ref.span_ms():6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
