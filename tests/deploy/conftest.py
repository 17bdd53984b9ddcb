"""The deploy tests validate manifests with jsonschema (kubernetes-validate's schemas, the
Prometheus-operator CRDs). jsonschema imports ``rfc3987_syntax`` where it is installed (jupyterlab,
HolisticTraceAnalysis's dependency, brings it) for its optional "iri" format checks, and importing it
builds 39 lark grammars: 2 s of CPU in every xdist worker that runs a deploy test. None of these
schemas is checked for formats (jsonschema checks none unless given a FormatChecker), so the module
is marked missing here, before any test module imports jsonschema: jsonschema then leaves those
format checks out, as on a machine without it."""

from __future__ import annotations

import sys

sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]  # None: "not importable"
