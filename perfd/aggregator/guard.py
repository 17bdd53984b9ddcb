"""What an agent may write, checked before anything reaches the aggregator's state.

Hosts of a job (docs/reliability.md, "Who may write a job"): the agents whose Hello names the job
(its ``--job``, or the job of its ``--launch-manifest``), plus the first agent that reported the
job's job info or step records when no Hello had named it. Only hosts may write a job's step
records and job info; anything else is refused and counted (``not_host``). Capture commands go to
hosts only. Between two hosts writing the same iteration, :meth:`Guard.standing` says who is
trusted more (a Hello-named host over a first writer), and the job store lets the host that
continues the job take an iteration another wrote ahead of it. Since an agent id is bound to its
credentials (perfd.transport.server), a host cannot be impersonated by a client holding other
credentials.

With an identity policy (``--identity-policy``, mutual TLS; perfd.transport.security) an agent may
name, host and write only the jobs its certificate's entry gives it (``identity_policy``), whether
or not it is a host: a Hello naming another's job makes nobody its host.

Caps (perfd.core.limits) count what is held *now*. A job is held by the agents that name it in a Hello
or write it; the lifecycle (perfd.aggregator.retention) releases an agent's hold when its stream
ends on a job it only named, and a job whole when it is pruned — so the jobs cap frees as jobs end,
also across a restart. Each agent id and each identity (a certificate, or the address of a client
without credentials) holds at most its quota of the cap, so no one client takes all of it; at the
cap (or a quota) the lifecycle is asked to make room by pruning the job that ended first
(``make_room``), and only then is the newcomer refused. Series are counted per agent and identity
and released when the lifecycle forgets an agent. Refusals carry the agent, so they are counted
per reason and per agent (perfd.core.refusals).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from perfd.core import events as E
from perfd.core import limits as L
from perfd.core.bounds import check_step_record
from perfd.core.limits import Limits
from perfd.core.model import CollectiveRecord, LabelSet, StepRecord
from perfd.core.refusals import Refusals
from perfd.transport.security import SHARED_TOKEN_IDENTITY

# Asked at the cap or a quota, with the jobs room may be made among: True when one was pruned.
MakeRoom = Callable[[Collection[str]], bool]


class _Full(Exception):
    """A cap or quota is reached; ``among``: the held jobs whose pruning would make room."""

    def __init__(self, reason: str, text: str, among: Collection[str]) -> None:
        super().__init__(text)
        self.reason, self.text, self.among = reason, text, among


class Guard:
    def __init__(self, limits: Limits, refusals: Refusals,
                 job_allowed: Callable[[str, str], bool] | None = None,
                 identity_of: Callable[[str], str | None] | None = None) -> None:
        self.limits = limits
        self.refusals = refusals
        self.job_allowed = job_allowed  # (agent, job) -> whether the identity policy allows it
        self.identity_of = identity_of or (lambda agent: None)  # agent -> its bound identity
        self.make_room: MakeRoom | None = None  # set by the lifecycle
        # agent -> the jobs whose processes run on the GPUs it reports (set by the aggregator:
        # perfd.aggregator.nodes.NodeView.jobs_on); such an agent may report events of those jobs.
        self.placed_jobs: Callable[[str], Collection[str]] = lambda agent: ()
        # agent -> the node its live Hello names (set by the aggregator; None: no live Hello): a node
        # agent of a job is on a node the job's hosts name.
        self.node_of: Callable[[str], str | None] = lambda agent: None
        self.replaying = False  # the state store's replay (perfd.aggregator.durable)
        self._lock = threading.Lock()  # the HTTP thread reads hosts (capture routing)
        self._hosts: dict[str, set[str]] = {}
        self._named: dict[str, set[str]] = {}  # job -> the hosts whose Hello names it (standing 2)
        self._holders: dict[str, set[str]] = {}  # job -> agents holding it
        self._held_by: dict[str, set[str]] = {}  # agent -> jobs it holds
        self._agent_identity: dict[str, str] = {}  # agent -> the identity its holds count against
        self._identity_jobs: dict[str, dict[str, int]] = {}  # identity -> job -> its agents holding it
        self.series = 0  # series definitions held, all agents together
        self._series_of: dict[str, int] = {}  # agent -> series definitions held
        self._identity_series: dict[str, int] = {}

    # ---- jobs -----------------------------------------------------------------------------------
    def _quota_identity(self, agent: str) -> str | None:
        """The identity whose quota ``agent``'s holds count against (None: no identity quota — not
        bound yet, as when replaying the state store, or the shared token)."""
        ident = self._agent_identity.get(agent) or self.identity_of(agent)
        return None if ident is None or ident == SHARED_TOKEN_IDENTITY else ident

    def _check(self, job: str, agent: str) -> bool:
        """True: ``agent`` holds ``job`` now; False: refused (counted); _Full: room is needed."""
        if self.job_allowed is not None and not self.job_allowed(agent, job):
            self.refusals.refuse(L.REFUSED_POLICY, f"job {job[:64]!r} from agent {agent[:64]}: not one "
                                 "the identity policy gives its certificate", agent=agent)
            return False
        holders = self._holders.get(job)
        if holders is not None and agent in holders:
            return True
        if len(job.encode()) > L.MAX_JOB_NAME_BYTES:
            self.refusals.refuse(L.REFUSED_LABELS, f"job name of {len(job.encode())} bytes from agent "
                                 f"{agent[:64]} (cap {L.MAX_JOB_NAME_BYTES})", agent=agent)
            return False
        if holders is None and len(self._holders) >= self.limits.max_jobs:
            raise _Full(L.REFUSED_JOBS, f"new job {job[:64]!r} from agent {agent[:64]}: "
                        f"{len(self._holders)} jobs held (cap {self.limits.max_jobs})", tuple(self._holders))
        mine = self._held_by.get(agent, set())
        quota = min(self.limits.max_jobs_per_agent, self.limits.max_jobs)
        if len(mine) >= quota:
            raise _Full(L.REFUSED_JOBS_QUOTA, f"job {job[:64]!r} from agent {agent[:64]}: it holds "
                        f"{len(mine)} jobs (quota {quota} per agent)", tuple(mine))
        ident = self._quota_identity(agent)
        theirs = self._identity_jobs.get(ident, {}) if ident is not None else {}
        quota = min(self.limits.max_jobs_per_identity, self.limits.max_jobs)
        if ident is not None and job not in theirs and len(theirs) >= quota:
            raise _Full(L.REFUSED_JOBS_QUOTA, f"job {job[:64]!r} from agent {agent[:64]}: identity "
                        f"{ident[:64]} holds {len(theirs)} jobs (quota {quota} per identity)", tuple(theirs))
        self._holders.setdefault(job, set()).add(agent)
        mine.add(job)
        self._held_by[agent] = mine
        if ident is not None:
            self._agent_identity[agent] = ident
            counts = self._identity_jobs.setdefault(ident, {})
            counts[job] = counts.get(job, 0) + 1
        return True

    def _admit(self, job: str, agent: str) -> bool:
        """:meth:`_check`, with one attempt at making room when a cap or quota is reached. Called
        without the lock: making room prunes a job, which releases it here."""
        for attempt in (0, 1):
            try:
                with self._lock:
                    return self._check(job, agent)
            except _Full as full:
                if attempt == 0 and self.make_room is not None and self.make_room(full.among):
                    continue
                self.refusals.refuse(full.reason, full.text, agent=agent)
                return False
        return False

    def admit_job(self, job: str, agent: str) -> bool:
        """True when ``agent`` holds ``job`` or may now (counted and logged otherwise)."""
        return self._admit(job, agent)

    def hello(self, agent: str, jobs: Sequence[str]) -> list[str]:
        """The agent hosts the jobs its Hello names; returns those admitted."""
        out = []
        for job in jobs:
            if self._admit(job, agent):
                with self._lock:
                    self._hosts.setdefault(job, set()).add(agent)
                    self._named.setdefault(job, set()).add(agent)
                out.append(job)
        return out

    def standing(self, job: str, agent: str) -> int:
        """How far ``agent``'s step records of ``job`` are trusted against another agent's for the same
        iteration (perfd.aggregator.jobs.JobStore._outranks): 2, a host its Hello named; 1, the host
        that only wrote first (no Hello named the job then); 0, no host."""
        with self._lock:
            if agent in self._named.get(job, ()):
                return 2
            return 1 if agent in self._hosts.get(job, ()) else 0

    def may_write(self, agent: str, job: str, what: str, n: int = 1) -> bool:
        """Whether ``agent`` may write ``job``'s step records / job info (it becomes the host of a
        job nobody hosts yet)."""
        if not self._admit(job, agent):
            return False
        with self._lock:
            hosts = self._hosts.setdefault(job, set())
            if not hosts:
                hosts.add(agent)
            if agent in hosts:
                return True
        self.refusals.refuse(L.REFUSED_NOT_HOST, f"{n} {what} for job {job[:64]!r} from agent {agent[:64]}, "
                             "which does not host it", n, agent=agent)
        return False

    def hosts(self, job: str) -> set[str]:
        with self._lock:
            return set(self._hosts.get(job, ()))

    def held_jobs(self) -> list[str]:
        """Every job held now (what the jobs cap counts)."""
        with self._lock:
            return sorted(self._holders)

    def jobs_of(self, agent: str) -> set[str]:
        with self._lock:
            return set(self._held_by.get(agent, ()))

    def release(self, agent: str, jobs: Iterable[str]) -> list[str]:
        """``agent`` no longer holds ``jobs`` (nor hosts them); returns those now held by nobody,
        which are released whole."""
        gone = []
        with self._lock:
            for job in jobs:
                holders = self._holders.get(job)
                if holders is None or agent not in holders:
                    continue
                holders.discard(agent)
                self._unhold(agent, job)
                hosts = self._hosts.get(job)
                if hosts is not None:
                    hosts.discard(agent)
                self._named.get(job, set()).discard(agent)
                if not holders:
                    del self._holders[job]
                    self._hosts.pop(job, None)
                    self._named.pop(job, None)
                    gone.append(job)
        return gone

    def forget_job(self, job: str) -> None:
        """The job was pruned: nobody holds or hosts it any more."""
        with self._lock:
            for agent in self._holders.pop(job, set()):
                self._unhold(agent, job)
            self._hosts.pop(job, None)
            self._named.pop(job, None)

    def _unhold(self, agent: str, job: str) -> None:
        mine = self._held_by.get(agent)
        if mine is not None:
            mine.discard(job)
            if not mine:
                del self._held_by[agent]
        ident = self._agent_identity.get(agent)
        counts = self._identity_jobs.get(ident) if ident is not None else None
        if counts is not None and job in counts:
            counts[job] -= 1
            if counts[job] <= 0:
                del counts[job]
            if not counts:
                del self._identity_jobs[ident or ""]
        if agent not in self._held_by and self._series_of.get(agent, 0) == 0:
            self._agent_identity.pop(agent, None)

    def steps(self, agent: str, steps: Sequence[StepRecord]) -> list[StepRecord]:
        """The records of the jobs ``agent`` may write, their values within perfd.core.bounds
        (:meth:`bounded`)."""
        by_job: dict[str, list[StepRecord]] = {}
        for r in steps:
            by_job.setdefault(r.job, []).append(r)
        out: list[StepRecord] = []
        for job, recs in by_job.items():
            if self.may_write(agent, job, "step records", len(recs)):
                out.extend(recs)
        self.bounded(agent, out)
        return out

    def bounded(self, agent: str, recs: Sequence[StepRecord]) -> None:
        """Remove each value of ``recs`` outside perfd.core.bounds (check_step_record) before anything sums
        it — two step times of 1e308 overflowed a job's analysis on every tick: it
        becomes absent, the record is kept; counted (``step_value``) and logged with what it was."""
        removed = [f"job {r.job[:64]!r} iteration {r.iteration}: {why}"
                   for r in recs for why in check_step_record(r)]
        if removed:
            self.refusals.refuse(L.REFUSED_STEP_VALUE, f"{len(removed)} value(s) of step records from agent "
                                 f"{agent[:64]} outside perfd.core.bounds left out (absent), e.g. "
                                 f"{removed[0][:300]}", len(removed), agent=agent)

    def collectives(self, agent: str, recs: Sequence[CollectiveRecord]) -> list[CollectiveRecord]:
        ok = {job for job in {r.job for r in recs} if self.admit_job(job, agent)}
        return [r for r in recs if r.job in ok] if len(ok) < len({r.job for r in recs}) else list(recs)

    def typed_events(self, agent: str, evs: Sequence[Mapping[str, object]]
                     ) -> list[tuple[int, dict[str, Any], bool]]:
        """A batch's events as their kinds declare them (perfd.core.events.checked), before anything else
        reads them: (index in the batch, the event, whether entries of its payload were left out). An
        event, or an entry of its payload, that is not of its declared type is refused and counted
        (``malformed_event``, one per event or entry) with what was wrong — never read further, so
        never raised in a tick."""
        out = []
        for i, e in enumerate(evs):
            ev, problems = E.checked(e)
            if problems:
                kind = str(e.get("kind", ""))[:64]
                self.refusals.refuse(L.REFUSED_MALFORMED_EVENT, f"{len(problems)} of a {kind} event from "
                                     f"agent {agent[:64]} ({'entries' if ev is not None else 'the event'}): "
                                     f"{'; '.join(problems[:3])[:300]}", len(problems), agent=agent)
            if ev is not None:
                out.append((i, ev, bool(problems)))
        return out

    def events(self, agent: str, events: Sequence[Mapping[str, object]]) -> list[int]:
        """The indices of ``events`` the agent may send. An event is about every job it names: its
        ``job``, its payload's (which must agree), and each job the entries of a list payload declare
        (the processes of a GPU: a job-less event is no exception). It is taken only
        when the agent may speak for each of them (:meth:`_speaks_for`); otherwise refused and counted
        (``not_host``: a stranger's phases, stopped ranks and stacks once went into
        another job's stall, and a stranger once made itself a node agent of the job by reporting
        its rank on a GPU of its own)."""
        out: list[int] = []
        refused: dict[str, int] = {}
        for i, e in enumerate(events):
            job = str(e.get("job") or "")
            payload = e.get("payload")
            said = payload.get("job") if isinstance(payload, Mapping) else None
            if said is not None and str(said) != job:
                refused[f"{str(said)[:64]!r} in the payload of an event of job {job[:64]!r}"] = 1
                continue
            labels = e.get("labels")
            gpu_node: str | None = None  # the GPU's node, for a process list
            if e.get("kind") == E.GPU_PROCESSES.name:
                gpu_node = str(labels.get("node") or agent) if isinstance(labels, Mapping) else agent
            for about in _jobs_about(job, payload):
                verdict = self._speaks_for(agent, about, gpu_node)
                if verdict is not True:
                    if verdict is False:  # None: refused by the identity policy, counted there
                        refused[about] = refused.get(about, 0) + 1
                    break
            else:
                out.append(i)
        for job, n in refused.items():
            self.refusals.refuse(L.REFUSED_NOT_HOST, f"{n} event(s) about job {job[:64]} from agent "
                                 f"{agent[:64]}, which does not host it (a node's agent speaks for the "
                                 "jobs of its node: give it and the job's agents the same --node)", n,
                                 agent=agent)
        return out

    def _speaks_for(self, agent: str, job: str, gpu_node: str | None) -> bool | None:
        """Whether ``agent`` may report events of ``job``: a host of it (becoming the host of a job
        nobody hosts, as for step records), or the job's node agent. A node agent (the DaemonSet's,
        no job of its own) is one whose Hello names a node a host of the job named in its own Hello;
        the GPU processes it reports are of that node (``gpu_node``: their GPU's node label), and its
        other events only of a job its GPUs run (``placed_jobs``). What the agent itself says about
        its GPUs no longer makes it the node agent of whatever job it names.
        While the state store is replayed (no Hello is live: no node is known) what was journalled
        passed this check when it arrived. None: the identity policy refuses it (counted)."""
        if self.job_allowed is not None and not self.job_allowed(agent, job):
            self.refusals.refuse(L.REFUSED_POLICY, f"an event of job {job[:64]!r} from agent "
                                 f"{agent[:64]}: not one the identity policy gives its certificate",
                                 agent=agent)
            return None
        with self._lock:
            hosts = set(self._hosts.get(job, ()))
        if agent in hosts:
            return True
        if not hosts:
            return self.may_write(agent, job, "events")
        if self.replaying:
            node_agent = gpu_node is not None or job in self.placed_jobs(agent)
        else:
            mine = self.node_of(agent)
            node_agent = bool(mine) and mine in {self.node_of(h) for h in hosts} and (
                gpu_node == mine if gpu_node is not None else job in self.placed_jobs(agent))
        return node_agent and self.admit_job(job, agent)

    # ---- series ---------------------------------------------------------------------------------
    def admit_series(self, agent: str, name: str, labels: LabelSet) -> bool:
        if len(labels) > L.MAX_LABELS_PER_SERIES or not _labels_fit(labels):
            self.refusals.refuse(L.REFUSED_LABELS, f"series {name[:64]} of agent {agent[:64]}: more than "
                                 f"{L.MAX_LABELS_PER_SERIES} labels or a value over "
                                 f"{L.MAX_LABEL_VALUE_BYTES} bytes", agent=agent)
            return False
        with self._lock:
            ident = self._quota_identity(agent)
            quota = min(self.limits.max_series_per_identity, self.limits.max_series)
            if self.series >= self.limits.max_series:
                why: tuple[str, str] | None = (L.REFUSED_SERIES,
                                               f"{self.limits.max_series} series held (cap)")
            elif ident is not None and self._identity_series.get(ident, 0) >= quota:
                why = (L.REFUSED_SERIES_QUOTA, f"identity {ident[:64]} holds {quota} series (quota per "
                                               "identity)")
            else:
                why = None
                self.series += 1
                self._series_of[agent] = self._series_of.get(agent, 0) + 1
                if ident is not None:
                    self._agent_identity[agent] = ident
                    self._identity_series[ident] = self._identity_series.get(ident, 0) + 1
        if why is not None:
            self.refusals.refuse(why[0], f"series {name[:64]} of agent {agent[:64]}: {why[1]}", agent=agent)
        return why is None

    def release_series(self, agent: str, n: int | None = None) -> None:
        """``n`` of the agent's series definitions are no longer held (None: all of them)."""
        with self._lock:
            held = self._series_of.get(agent, 0)
            n = held if n is None else min(n, held)
            if n <= 0:
                return
            self.series -= n
            self._series_of[agent] = held - n
            ident = self._agent_identity.get(agent)
            if ident is not None and ident in self._identity_series:
                self._identity_series[ident] = max(0, self._identity_series[ident] - n)
                if not self._identity_series[ident]:
                    del self._identity_series[ident]
            if not self._series_of[agent]:
                del self._series_of[agent]
                if agent not in self._held_by:
                    self._agent_identity.pop(agent, None)

    def series_of(self, agent: str) -> int:
        with self._lock:
            return self._series_of.get(agent, 0)


def _labels_fit(labels: LabelSet) -> bool:
    """Every key within MAX_LABEL_VALUE_BYTES characters and every value within as many bytes of
    UTF-8. A value of n characters is at most 4n bytes, so only a long one is encoded: every series
    of an agent's first contact comes through here (2,000 agents × 200 series after a restart)."""
    m = L.MAX_LABEL_VALUE_BYTES
    if all(len(k) <= m and len(v) * 4 <= m for k, v in labels):
        return True
    return all(len(k) <= m and len(v.encode()) <= m for k, v in labels)


def _jobs_about(job: str, payload: object) -> list[str]:
    """Every job an event is about: its own, and those the entries of a list payload declare."""
    out = [job] if job else []
    if isinstance(payload, list):
        out += sorted({j for p in payload if isinstance(p, Mapping) and isinstance(j := p.get("job"), str)
                       and j and j != job})
    return out
