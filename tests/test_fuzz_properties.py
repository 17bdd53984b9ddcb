"""Property-based fuzzing (hypothesis) of every parser that reads input perfd does not control, and of
the analyses on what they parse: no exception escapes, and every rejection is counted.

Inputs start from recorded real data (Megatron and SGLang logs, NCCL Inspector lines, Flight
Recorder pickles) and are mutated — numbers swapped for extreme or non-numbers, spans cut, noise
inserted — so the examples reach deep into each parser rather than failing at its first check.
Budgets are modest (a 2-core CI): ``max_examples`` 50-100, no deadline.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from perfd.analytics.run.run_analysis import analyze_run
from perfd.analytics.serving.serving_analysis import analyze_serving
from perfd.collectors.megatron import parse_lines as parse_megatron
from perfd.collectors.nccl.flight_recorder import DumpError, load_dump_bytes, parse_dump
from perfd.collectors.nccl.inspector import InspectorLineError, parse_line
from perfd.collectors.sglang.parser import parse_lines as parse_sglang
from perfd.core import bounds, finite_json
from perfd.core.jobinfo_json import decode_job_info, job_info_to_json
from perfd.report.row_json import run_json
from perfd.report.serving_report import build_serving_report, serving_json
from perfd.rules.expr import ExprError, compile_expr
from perfd.rules.pack_loader import parse_pack

ROOT = Path(__file__).resolve().parents[1]
MEGATRON = (ROOT / "tests" / "data" / "megatron" / "tp2_swiglu_gqa_untied.log").read_text().splitlines()
SGLANG = (ROOT / "perfd" / "collectors" / "sglang" / "tests" / "data"
          / "sglang_0_5_5_dp2.log").read_text().splitlines()
FR_DUMP = (ROOT / "perfd" / "collectors" / "nccl" / "tests" / "data" / "nccl_fixtures" / "timing"
           / "dump00_rank0").read_bytes()
INSPECTOR = json.dumps({
    "header": {"id": "0xabc", "comm_name": "DP Group 0", "rank": 0, "n_ranks": 2, "nnodes": 1},
    "metadata": {"hostname": "node0", "pid": 100, "dump_timestamp_us": 12},
    "coll_perf": {"coll": "AllReduce", "coll_sn": 1, "coll_msg_size_bytes": 268435456,
                  "coll_exec_time_us": 930, "coll_timing_source": "kernel_gpu",
                  "coll_algobw_gbs": 288.63, "coll_busbw_gbs": 288.63}})
PACK = ROOT / "rules" / "default.yaml"

# derandomize: CI runs the same examples every time (a new failure shows up in a change that causes
# it, not at random); to explore further, run it locally with derandomize=False.
SETTINGS = settings(max_examples=60, derandomize=True)
NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")

# What a corrupt or hostile source puts where a number belongs.
EXTREME = st.one_of(
    st.sampled_from(["0", "-1", "1e308", "1.7e308", "1e309", "inf", "nan", "-0", "", "x", "1" + "0" * 29,
                     "9" * 400, "0.0000001", "1e-320"]),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


@st.composite
def mutated_lines(draw: st.DrawFn, lines: list[str], max_mutations: int = 12) -> list[str]:
    out = list(lines)
    for _ in range(draw(st.integers(0, max_mutations))):
        i = draw(st.integers(0, len(out) - 1))
        line = out[i]
        how = draw(st.sampled_from(["number", "number", "cut", "noise", "duplicate", "delete"]))
        if how == "number":
            nums = list(NUMBER.finditer(line))
            if nums:
                m = nums[draw(st.integers(0, len(nums) - 1))]
                line = line[:m.start()] + draw(EXTREME) + line[m.end():]
        elif how == "cut":
            line = line[:draw(st.integers(0, len(line)))]
        elif how == "noise":
            at = draw(st.integers(0, len(line)))
            line = line[:at] + draw(st.text(max_size=40)) + line[at:]
        elif how == "duplicate":
            out.insert(i, line)
        else:
            del out[i]
            continue
        out[i] = line
    return out


def _counted(counts: dict[str, int], issues: list[object]) -> None:
    """Every issue kept is counted under malformed:<reason>, and no parser bug was swallowed."""
    assert "malformed:internal-error" not in counts
    malformed = sum(v for k, v in counts.items() if k.startswith("malformed:"))
    assert malformed == len(issues) + counts.get("issues_dropped", 0)


@pytest.mark.slow
@SETTINGS
@given(mutated_lines(MEGATRON))
def test_megatron_parser_and_analysis(lines: list[str]) -> None:
    log = parse_megatron(lines)
    _counted(dict(log.counts), list(log.issues))
    # Whatever the parser kept is within the declared bounds: the analyses never see 10^29 layers.
    assert bounds.check_job_info(log.job_info) == []
    result = analyze_run(log.job_info, log.records)
    json.loads(finite_json.dumps(run_json(result)))
    # The job info crosses the network and decodes to the same values, with nothing refused.
    info, refused = decode_job_info(job_info_to_json(log.job_info))
    assert refused == [] and info == log.job_info


@pytest.mark.slow
@SETTINGS
@given(mutated_lines(SGLANG))
def test_sglang_parser_and_analysis(lines: list[str]) -> None:
    log = parse_sglang(lines)
    _counted(dict(log.counts), list(log.issues))
    analysis = analyze_serving("fuzz", log.records, log.server)
    json.loads(finite_json.dumps(serving_json(analysis)))  # its codes worded where shown
    json.loads(finite_json.dumps(build_serving_report(analysis).to_json()))


@settings(max_examples=100, derandomize=True)
@given(st.one_of(
    st.text(max_size=300),
    st.builds(lambda pre, mid, post: INSPECTOR[:pre] + mid + INSPECTOR[post:],
              st.integers(0, len(INSPECTOR)), st.one_of(EXTREME, st.text(max_size=20)),
              st.integers(0, len(INSPECTOR))),
))
def test_inspector_parser_raises_only_its_own_error(line: str) -> None:
    try:
        rec = parse_line(line, "fuzz", "fuzz.log:1")
    except InspectorLineError as exc:
        assert str(exc)  # the reason the collector counts
        return
    assert rec.job == "fuzz"


@settings(max_examples=100, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, len(FR_DUMP) - 1), st.integers(0, 255)), max_size=8),
       st.integers(0, len(FR_DUMP)))
def test_flight_recorder_unpickler_and_parser(flips: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(FR_DUMP)
    for at, byte in flips:
        data[at] = byte
    try:
        raw = load_dump_bytes(bytes(data[:cut] if cut else data))
    except DumpError as exc:
        assert exc.reason in ("too_large", "refused_global", "truncated", "malformed", "not_a_dict")
        return
    dump = parse_dump(raw, 0, "fuzz")
    assert all(isinstance(v, int) and v > 0 for v in dump.issues.values())


@settings(max_examples=100, derandomize=True)
@given(st.one_of(
    st.text(max_size=200),
    st.text(alphabet="()+-*/<>=! andotr0123456789.gpu_util%ms", max_size=200),
))
def test_rule_expressions_raise_only_expr_error(text: str) -> None:
    try:
        compile_expr(text)
    except ExprError as exc:
        assert exc.column >= 1


@pytest.mark.slow
@SETTINGS
@given(mutated_lines(PACK.read_text().splitlines(), max_mutations=6))
def test_rule_packs_give_errors_not_exceptions(lines: list[str]) -> None:
    pack, errors = parse_pack("\n".join(lines), "fuzz.yaml")
    assert (pack is None) == bool(errors)
    assert all(e.message for e in errors)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**40), 10**40) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)
JOB_INFO_KEYS = st.sampled_from(["layout", "spec", "startup_timers", "log_interval", "framework",
                                 "tp", "pp", "num_layers", "hidden_size", "per_rank", "min_ms", "load"])


@pytest.mark.slow
@settings(max_examples=100, derandomize=True)
@given(st.recursive(JSON_VALUES, lambda inner: st.dictionaries(JOB_INFO_KEYS, inner, max_size=5),
                    max_leaves=30))
def test_job_info_from_the_network_is_decoded_or_refused(obj: object) -> None:
    """What the aggregator's on_batch does with job info: ValueError/TypeError (counted as
    job_info_errors) or a JobInfo within perfd.core.bounds, never another exception."""
    try:
        info, _ = decode_job_info(json.dumps(obj))
    except (ValueError, TypeError):
        return
    assert bounds.check_job_info(info) == []


# ---- the aggregator's HTTP API on a real socket ------------------------------------------------------
# Every body a client may send gets an answer below 500 and leaves no traceback in the log: before,
# 136 of 8,486 fuzzed requests answered 500 (deeply nested JSON reached the parser's recursion limit,
# including on POST /healthz without a token; Alertmanager labels that were not an object).

class _Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def api() -> Iterator[tuple[int, _Tracebacks]]:
    from perfd.aggregator.captures import CaptureCoordinator
    from perfd.aggregator.http import HttpServer
    from perfd.aggregator.state import AggregatorState

    state = AggregatorState()
    caps = CaptureCoordinator(state, None, lambda agent, cmd: False)
    srv = HttpServer(state, "127.0.0.1", 0, caps)
    errors = _Tracebacks()
    logging.getLogger("perfd").addHandler(errors)
    srv.start()
    try:
        yield srv.port, errors
    finally:
        srv.stop()
        logging.getLogger("perfd").removeHandler(errors)


def _request(port: int, method: str, path: str, body: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        return conn.getresponse().status
    finally:
        conn.close()


NESTED = st.builds(lambda opener, n, tail: (opener * n + tail).encode(),
                   st.sampled_from(["[", "{\"a\":", "[{\"b\":"]), st.integers(1, 20_000),
                   st.sampled_from(["", "1", "]", "}"]))
ALERT_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.text(max_size=12) | st.just("firing"),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["job_name", "rank", "perfd_ranks", "perfd_steps", "perfd_tool", "alertname",
                         "status", "labels", "x"]), inner, max_size=5), max_leaves=15)
BODIES = st.one_of(
    NESTED,
    st.binary(max_size=200),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["job", "ranks", "steps", "tool", "alerts"]), ALERT_VALUES,
                    max_size=5).map(lambda v: json.dumps(v).encode()),
    st.lists(ALERT_VALUES, max_size=5).map(lambda a: json.dumps({"alerts": a}).encode()),
)


@pytest.mark.slow
@settings(max_examples=150, derandomize=True,
          suppress_health_check=[HealthCheck.data_too_large])
@given(method=st.sampled_from(["POST", "POST", "GET", "PUT"]),
       path=st.sampled_from(["/api/captures", "/api/alertmanager", "/healthz", "/metrics", "/api/jobs",
                             "/api/jobs/x/summary", "/nowhere"]),
       body=BODIES)
@example(method="POST", path="/healthz", body=b"[" * 5000)  # no token needed: it was a 500
@example(method="POST", path="/api/alertmanager", body=b'{"alerts": [{"status": "firing", "labels": ["x"]}]}')
def test_http_bodies_get_an_answer_below_500(api: tuple[int, _Tracebacks], method: str, path: str,
                                             body: bytes) -> None:
    port, errors = api
    status = _request(port, method, path, body)
    assert status < 500, (method, path, body[:200], status)
    assert not errors.records, [r.getMessage() for r in errors.records][:3]


@pytest.mark.slow
@settings(max_examples=100, derandomize=True)
@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda a, b: b"GET " + a + b" HTTP/1.1\r\n" + b + b"\r\n\r\n",
                           st.binary(max_size=60), st.binary(max_size=120))))
def test_raw_request_heads_get_an_answer_below_500(api: tuple[int, _Tracebacks], raw: bytes) -> None:
    """Arbitrary bytes as a request: an answer below 500, or a closed connection (the head never
    ended: the header deadline), never a traceback."""
    port, errors = api
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(raw + b"\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    if got:
        assert got.startswith(b"HTTP/1."), got[:100]
        assert int(got.split()[1]) < 500 or got.split()[1] == b"505", got[:200]  # 505: HTTP/2.0 asked
    assert not errors.records, [r.getMessage() for r in errors.records][:3]
