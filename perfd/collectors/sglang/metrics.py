"""Read an SGLang ``/metrics`` endpoint (``--enable-metrics``) into a MetricsSnapshot.

The exposition is parsed with ``prometheus_client.parser`` (text format 0.0.4): gauges, counters
(``*_total`` samples) and histograms (``_bucket{le=...}``, ``_count``, ``_sum``). Only ``sglang:``
names are kept unless ``prefix`` says otherwise; ``*_created`` series are skipped. Never raises:
fetch and parse failures come back as ``(None, reason)``.
"""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from perfd.core.model import LabelSet
from perfd.core.serving_records import HistogramSeries, MetricsSnapshot

MAX_BYTES = 16 << 20  # an exposition larger than this is not SGLang's


def _labels(d: dict[str, str], drop: str | None = None) -> LabelSet:
    return tuple(sorted((k, v) for k, v in d.items() if k != drop))


def parse_exposition(text: str, time: float, source: str, prefix: str = "sglang:") -> MetricsSnapshot:
    """Parse Prometheus text exposition; what cannot be used is listed in ``snapshot.issues``."""
    snap = MetricsSnapshot(time=time, source=source)
    buckets: dict[str, dict[LabelSet, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[str, dict[LabelSet, float]] = defaultdict(dict)
    sums: dict[str, dict[LabelSet, float]] = defaultdict(dict)
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError (and others) on malformed text
        snap.issues.append(f"unparseable exposition: {type(exc).__name__}: {str(exc)[:200]}")
        return snap
    for fam in families:
        if prefix and not fam.name.startswith(prefix):
            continue
        for s in fam.samples:
            name, labels, value = s.name, dict(s.labels), float(s.value)
            if name.endswith("_created"):
                continue
            if fam.type == "histogram" or (name.endswith("_bucket") and "le" in labels):
                base = fam.name if fam.type == "histogram" else name.removesuffix("_bucket")
                if name.endswith("_bucket"):
                    try:
                        le = float(labels["le"])
                    except (KeyError, ValueError):
                        snap.issues.append(f"{name}: bucket without a numeric le")
                        continue
                    buckets[base][_labels(labels, "le")].append((le, value))
                elif name.endswith("_count"):
                    counts[base][_labels(labels)] = value
                elif name.endswith("_sum"):
                    sums[base][_labels(labels)] = value
                continue
            if fam.type == "counter" or (fam.type == "unknown" and name.endswith("_total")):
                snap.counters.setdefault(name, []).append((_labels(labels), value))
            elif fam.type in ("gauge", "unknown", "untyped"):
                snap.gauges.setdefault(name, []).append((_labels(labels), value))
            elif fam.type == "summary":
                continue
    for base, series in buckets.items():
        for lab, bs in series.items():
            bs.sort(key=lambda x: x[0])
            if not bs or not math.isinf(bs[-1][0]):
                snap.issues.append(f"{base}{dict(lab)}: no +Inf bucket; left out")
                continue
            snap.histograms.setdefault(base, []).append(
                HistogramSeries(lab, tuple(bs), counts[base].get(lab), sums[base].get(lab)))
    return snap


def scrape(url: str, now: float, timeout_s: float = 3.0) -> tuple[MetricsSnapshot | None, str | None]:
    """GET ``url`` and parse it; (snapshot, None) or (None, reason)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            data = resp.read(MAX_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"fetch-failed:{type(exc).__name__}"
    if len(data) > MAX_BYTES:
        return None, "response-too-large"
    snap = parse_exposition(data.decode("utf-8", "replace"), now, url)
    return snap, None


def read_file(path: str | Path, time: float) -> tuple[MetricsSnapshot | None, str | None]:
    """A saved exposition (``curl .../metrics > file``); ``time`` is when it was taken."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return None, f"read-failed:{type(exc).__name__}"
    return parse_exposition(text, time, str(path)), None
