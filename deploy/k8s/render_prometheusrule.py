#!/usr/bin/env python3
"""Write deploy/k8s/prometheusrule.yaml from deploy/prometheus/perfd.rules.yml (one source of rules).

    python3 deploy/k8s/render_prometheusrule.py           # rewrite prometheusrule.yaml
    python3 deploy/k8s/render_prometheusrule.py --check   # exit 1 if it is stale (tests run this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RULES = HERE.parent / "prometheus" / "perfd.rules.yml"
OUT = HERE / "prometheusrule.yaml"
HEADER = ("# Generated from deploy/prometheus/perfd.rules.yml by deploy/k8s/render_prometheusrule.py:\n"
          "# edit that file, then run this script. kube-prometheus-stack selects rules by its release\n"
          "# label: set it to yours.\n")


def render(rules_path: Path = RULES) -> str:
    groups = yaml.safe_load(rules_path.read_text())["groups"]
    doc = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "perfd", "namespace": "perfd",
                     "labels": {"app.kubernetes.io/name": "perfd", "release": "kube-prometheus-stack"}},
        "spec": {"groups": groups},
    }
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if prometheusrule.yaml is stale")
    ns = ap.parse_args(argv)
    text = render()
    if ns.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"stale: {OUT} (run {Path(__file__).name})", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
