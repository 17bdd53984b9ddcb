"""Whether a string can name a job, checked where a person or a manifest gives one (``perfd launch
--job``, ``perfd agent --job``, a launch manifest's ``job``).

An empty name used to become the job "default", and a variable the environment never set (Kubernetes
leaves ``$(PERFD_JOB)`` as it is written when PERFD_JOB is missing; a quoted ``${PERFD_JOB}`` in a unit
file) became a job called that: both merge the ranks of unrelated pods into one job, whose figures are
then nobody's. Refused instead, with the reason.
"""

from __future__ import annotations

import re

MAX_JOB_NAME = 253  # a Kubernetes object name's limit: a job's name is often a pod label or a Job's name
# $(VAR) (Kubernetes), ${VAR} and $VAR (shells, systemd), {{ .Values.x }} (Helm, Jinja) left unexpanded
_UNEXPANDED = re.compile(r"\$\(|\$\{|\$[A-Za-z_]|\{\{|\}\}")


def job_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a job, or None when it can."""
    if not name.strip():
        return "is empty: give the job's name (an empty one would merge unrelated jobs into one)"
    if _UNEXPANDED.search(name):
        return (f"{name!r} is a variable left unexpanded: the environment that should have set it did "
                "not (in Kubernetes, $(VAR) stays as written when VAR is not defined before it)")
    if name != name.strip():
        return f"{name!r} starts or ends with white space"
    if not name.isprintable():
        return f"{name!r} holds a control character"
    if len(name) > MAX_JOB_NAME:
        return f"is {len(name)} characters long (at most {MAX_JOB_NAME})"
    return None
