"""What an agent may write, checked before anything reaches the aggregator's state.

Hosts of a job (docs/reliability.md, "Who may write a job"): the agents whose Hello names the job
(its ``--job``, or the job of its ``--launch-manifest``), plus the first agent that reported the
job's job info or step records when no Hello had named it. Only hosts may write a job's step
records and job info; anything else is refused and counted (``not_host``). Capture commands go to
hosts only. Since an agent id is bound to its credentials (perfd.transport.server), a host cannot
be impersonated by a client holding other credentials.

With an identity policy (``--identity-policy``, mutual TLS; perfd.transport.security) an agent may
name, host and write only the jobs its certificate's entry gives it (``identity_policy``), whether
or not it is a host: a Hello naming another's job makes nobody its host.

Caps (perfd.limits): job names held (``jobs_cap``), series held and labels per series
(``series_cap``, ``label_cap``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence

from perfd import limits as L
from perfd.limits import Limits
from perfd.model import CollectiveRecord, LabelSet, StepRecord
from perfd.refusals import Refusals


class Guard:
    def __init__(self, limits: Limits, refusals: Refusals,
                 job_allowed: Callable[[str, str], bool] | None = None) -> None:
        self.limits = limits
        self.refusals = refusals
        self.job_allowed = job_allowed  # (agent, job) -> whether the identity policy allows it
        self._lock = threading.Lock()  # the HTTP thread reads hosts (capture routing)
        self._hosts: dict[str, set[str]] = {}
        self._jobs: set[str] = set()
        self.series = 0  # series definitions accepted, all agents together

    # ---- jobs -----------------------------------------------------------------------------------
    def admit_job(self, job: str, agent: str) -> bool:
        """True when ``job`` is held or there is room for it (counted and logged otherwise)."""
        with self._lock:
            return self._admit(job, agent)

    def _admit(self, job: str, agent: str) -> bool:
        if self.job_allowed is not None and not self.job_allowed(agent, job):
            self.refusals.refuse(L.REFUSED_POLICY, f"job {job[:64]!r} from agent {agent[:64]}: not one "
                                 "the identity policy gives its certificate")
            return False
        if job in self._jobs:
            return True
        if len(job.encode()) > L.MAX_JOB_NAME_BYTES:
            self.refusals.refuse(L.REFUSED_LABELS, f"job name of {len(job.encode())} bytes from agent "
                                 f"{agent} (cap {L.MAX_JOB_NAME_BYTES})")
            return False
        if len(self._jobs) >= self.limits.max_jobs:
            self.refusals.refuse(L.REFUSED_JOBS, f"new job {job[:64]!r} from agent {agent}: "
                                 f"{len(self._jobs)} jobs held (cap {self.limits.max_jobs})")
            return False
        self._jobs.add(job)
        return True

    def hello(self, agent: str, jobs: Sequence[str]) -> list[str]:
        """The agent hosts the jobs its Hello names; returns those admitted."""
        out = []
        with self._lock:
            for job in jobs:
                if self._admit(job, agent):
                    self._hosts.setdefault(job, set()).add(agent)
                    out.append(job)
        return out

    def may_write(self, agent: str, job: str, what: str, n: int = 1) -> bool:
        """Whether ``agent`` may write ``job``'s step records / job info (it becomes the host of a
        job nobody hosts yet)."""
        with self._lock:
            if not self._admit(job, agent):
                return False
            hosts = self._hosts.setdefault(job, set())
            if not hosts:
                hosts.add(agent)
            if agent in hosts:
                return True
        self.refusals.refuse(L.REFUSED_NOT_HOST, f"{n} {what} for job {job[:64]!r} from agent {agent}, "
                             "which does not host it", n)
        return False

    def hosts(self, job: str) -> set[str]:
        with self._lock:
            return set(self._hosts.get(job, ()))

    def steps(self, agent: str, steps: Sequence[StepRecord]) -> list[StepRecord]:
        by_job: dict[str, list[StepRecord]] = {}
        for r in steps:
            by_job.setdefault(r.job, []).append(r)
        out: list[StepRecord] = []
        for job, recs in by_job.items():
            if self.may_write(agent, job, "step records", len(recs)):
                out.extend(recs)
        return out

    def collectives(self, agent: str, recs: Sequence[CollectiveRecord]) -> list[CollectiveRecord]:
        ok = {job for job in {r.job for r in recs} if self.admit_job(job, agent)}
        return [r for r in recs if r.job in ok] if len(ok) < len({r.job for r in recs}) else list(recs)

    def events(self, agent: str, events: Iterable[dict[str, object]]) -> list[dict[str, object]]:
        return [e for e in events if not e.get("job") or self.admit_job(str(e["job"]), agent)]

    # ---- series ---------------------------------------------------------------------------------
    def admit_series(self, agent: str, name: str, labels: LabelSet) -> bool:
        if len(labels) > L.MAX_LABELS_PER_SERIES or not _labels_fit(labels):
            self.refusals.refuse(L.REFUSED_LABELS, f"series {name[:64]} of agent {agent}: more than "
                                 f"{L.MAX_LABELS_PER_SERIES} labels or a value over "
                                 f"{L.MAX_LABEL_VALUE_BYTES} bytes")
            return False
        with self._lock:
            if self.series >= self.limits.max_series:
                full = True
            else:
                self.series += 1
                full = False
        if full:
            self.refusals.refuse(L.REFUSED_SERIES, f"series {name[:64]} of agent {agent}: "
                                 f"{self.limits.max_series} series held (cap)")
        return not full


def _labels_fit(labels: LabelSet) -> bool:
    """Every key within MAX_LABEL_VALUE_BYTES characters and every value within as many bytes of
    UTF-8. A value of n characters is at most 4n bytes, so only a long one is encoded: every series
    of an agent's first contact comes through here (2,000 agents × 200 series after a restart)."""
    m = L.MAX_LABEL_VALUE_BYTES
    if all(len(k) <= m and len(v) * 4 <= m for k, v in labels):
        return True
    return all(len(k) <= m and len(v.encode()) <= m for k, v in labels)
