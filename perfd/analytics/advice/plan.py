"""The remedies as the plan an engineer would make (issue "the plan an engineer would make"): in the
order one applies them — the options that take minutes first, then the one install that covers the
most, then code changes — each with its effort, its typed relations to the others (one replaces
another, two overlap on the same kernels or gaps, one requires a package), its prerequisites checked
against what the job's start-up shows, and the combined gain of the set a user would apply, stage by
stage. Pure: fitted Advice in (perfd.analytics.advice.remedy_catalog), a typed Plan out; English only
in the views (perfd.report.plan_view; an item's action: perfd.report.remedy_text.worded_plan).

The combined gain is not the sum of the gains: each remedy names what it removes from which slice of
the step (:class:`~perfd.analytics.advice.remedies.Removal`); a set removes each slice once, the most
any of its remedies removes of it (fused attention removes the attention dropout's kernels with the rest
of attention; timer level 1 and a larger micro-batch act on the same synchronisation gaps).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfd.analytics.advice.remedies import (
    PACKAGE_CCE,
    PACKAGE_LIGER,
    Advice,
    Effort,
    JobConfig,
    NoGain,
    Removal,
    Risk,
    run_spread_ms,
)
from perfd.analytics.advice.remedy_said import Said
from perfd.analytics.advice.replay_gains import ReplayGains
from perfd.analytics.breakdown.replay_table import Change
from perfd.analytics.common import TextEnum
from perfd.core.model import ABSENT, PACKAGE_APEX, PACKAGE_FLASH_ATTN, PACKAGE_TE
from perfd.core.record_json import JsonWritten, unwritten


class Relation(TextEnum):
    REPLACES = "replaces"  # applied, it removes everything the other would: the other is moot
    REPLACED_BY = "replaced_by"  # the other removes everything this one would
    OVERLAPS = "overlaps"  # both remove some of the same kernels or gaps: counted once together
    REQUIRES = "requires"  # a package the remedy cannot run without


class Presence(TextEnum):
    """What the job's start-up shows of a package (Megatron-LM prints TE's version and warns when TE or
    Apex's CUDA extensions are missing; it says nothing of flash-attn)."""

    PRESENT = "present"
    ABSENT = "absent"
    UNKNOWN = "not shown"


PACKAGE_NAMES = {PACKAGE_TE: "Transformer Engine", PACKAGE_APEX: "Apex", PACKAGE_FLASH_ATTN: "flash-attn",
                 PACKAGE_LIGER: "Liger Kernel", PACKAGE_CCE: "Cut Cross-Entropy"}


@dataclass(frozen=True)
class Link(JsonWritten):
    relation: Relation
    target: str  # a RemedyId value, or a package for REQUIRES
    shared_ms: tuple[float, float] | None = None  # OVERLAPS / REPLACES: the gain they share, counted once


@dataclass(frozen=True)
class Prerequisite(JsonWritten):
    package: str
    presence: Presence
    # what the package must bring beyond being importable: "" until the report words it (by the package:
    # perfd.report.remedy_text.PACKAGE_NOTES), or as read back from JSON
    note: str = ""


@dataclass(frozen=True)
class PlanItem:
    remedy: str  # RemedyId value
    action: str  # its words: "" until the report words ``said`` (perfd.report.remedy_text.worded_plan)
    effort: Effort
    gain_ms: tuple[float, float] | None  # alone, with the run-to-run spread
    stage: int  # index into Plan.stages; -1: not in the set (its gain is not promised: measure it)
    links: tuple[Link, ...] = ()
    prerequisites: tuple[Prerequisite, ...] = ()
    moot_by: str | None = None  # an item of this or an earlier stage that replaces it
    flags: tuple[str, ...] = ()
    remove: tuple[str, ...] = ()
    any_of: bool = False  # any one of its prerequisites will do (TE or Apex)
    removes: tuple[Removal, ...] = ()  # what its gain is made of: a set of items is combined from them
    replay: Change | None = None  # the replay's change its gain was read from (Advice.replay)
    said: Said | None = None  # the action as its code (Advice.action); None once worded, or read back
    risk: Risk | None = None  # why its gain, wholly above zero, is not promised (Gain.risk): stage -1

    def to_json(self) -> dict[str, object]:
        return {
            "remedy": self.remedy,
            "action": self.action,
            "effort": self.effort.value,
            "any_of": self.any_of,
            "gain_ms": list(self.gain_ms) if self.gain_ms else None,
            "stage": self.stage,
            "links": [k.to_json() for k in self.links],
            "prerequisites": [p.to_json() for p in self.prerequisites],
            "moot_by": self.moot_by,
            "flags": list(self.flags),
            "remove": list(self.remove),
            "removes": [[r.atom, r.low_ms, r.high_ms] for r in self.removes],
            "replay": self.replay.value if self.replay is not None else None,
            "risk": self.risk.value if self.risk is not None else None,
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> PlanItem:
        g = d.get("gain_ms")
        return PlanItem(
            str(d["remedy"]),
            str(d.get("action") or ""),
            Effort(str(d["effort"])),
            (float(g[0]), float(g[1])) if isinstance(g, list) and len(g) == 2 else None,
            int(d.get("stage", -1)),
            tuple(
                Link(
                    Relation(str(k["relation"])),
                    str(k["target"]),
                    (float(k["shared_ms"][0]), float(k["shared_ms"][1])) if k.get("shared_ms") else None,
                )
                for k in d.get("links") or []
            ),
            tuple(
                Prerequisite(str(p["package"]), Presence(str(p["presence"])), str(p.get("note") or ""))
                for p in d.get("prerequisites") or []
            ),
            d.get("moot_by"),
            tuple(d.get("flags") or []),
            tuple(d.get("remove") or []),
            bool(d.get("any_of")),
            tuple(Removal(str(r[0]), float(r[1]), float(r[2])) for r in d.get("removes") or []),
            Change(str(d["replay"])) if d.get("replay") in Change.__members__.values() else None,
            risk=Risk(str(d["risk"])) if d.get("risk") in Risk.__members__.values() else None,
        )


@dataclass(frozen=True)
class PlanStage(JsonWritten):
    """One round of changes, then a re-capture: the items applied in it, what it installs (none for
    options), the combined gain of the stage on top of the ones before, and of everything up to it."""

    effort: Effort
    items: tuple[str, ...]
    gain_ms: tuple[float, float]
    total_ms: tuple[float, float]
    install: tuple[str, ...] = ()  # packages (any one of them, where several)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> PlanStage:
        return PlanStage(
            Effort(str(d["effort"])),
            tuple(str(x) for x in d.get("items") or []),
            (float(d["gain_ms"][0]), float(d["gain_ms"][1])),
            (float(d["total_ms"][0]), float(d["total_ms"][1])),
            tuple(str(x) for x in d.get("install") or []),
        )


@dataclass(frozen=True)
class Unmodelled(JsonWritten):
    """A remedy that fits the job but has no modelled gain (``why``): listed apart from the plan's items,
    neither ordered among them nor combined with them (a plan orders and adds up gains only)."""

    remedy: str  # RemedyId value
    action: str  # its words: "" until the report words ``said`` (perfd.report.remedy_text.worded_plan)
    effort: Effort
    why: NoGain
    said: Said | None = field(default=None, metadata=unwritten())  # the action as its code; None once
    # worded, or read back

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Unmodelled:
        why = str(d.get("why") or "")
        return Unmodelled(str(d["remedy"]), str(d.get("action") or ""), Effort(str(d["effort"])),
                          NoGain(why) if why in NoGain.__members__.values() else NoGain.NOT_MODELLED)


@dataclass(frozen=True)
class Plan(JsonWritten):
    step_ms: float
    items: tuple[PlanItem, ...]  # in the plan's order: each with a modelled gain
    stages: tuple[PlanStage, ...]
    spread_ms: float  # the run-to-run spread every combined gain carries once (remedies.run_spread_ms)
    replay: ReplayGains | None = None  # the replay's gains on the job's clock: its items combine by them
    unmodelled: tuple[Unmodelled, ...] = ()  # the remedies that fit but have no modelled gain: apart

    def item(self, remedy: str) -> PlanItem | None:
        return next((i for i in self.items if i.remedy == remedy), None)

    def combined(self, remedies: Iterable[str]) -> tuple[float, float]:
        """The combined gain of applying these of its items together (overlaps once, spread once)."""
        want = set(remedies)
        return combined([i for i in self.items if i.remedy in want], self.spread_ms, self.replay)

    @staticmethod
    def from_json(d: object) -> Plan | None:
        if not isinstance(d, Mapping):
            return None
        try:
            step = float(d["step_ms"])
            spread = d.get("spread_ms")  # a plan kept before the job's own spread: the floor
            return Plan(
                step,
                tuple(PlanItem.from_json(i) for i in d.get("items") or []),
                tuple(PlanStage.from_json(s) for s in d.get("stages") or []),
                float(spread) if isinstance(spread, (int, float)) else run_spread_ms(step, None),
                ReplayGains.from_json(d.get("replay")),
                tuple(Unmodelled.from_json(u) for u in d.get("unmodelled") or []),
            )
        except (KeyError, ValueError, TypeError, IndexError):
            return None


# --- the arithmetic ---------------------------------------------------------------------------------
def combined(advice: Iterable[Advice | PlanItem], spread_ms: float,
             replay: ReplayGains | None = None) -> tuple[float, float]:
    """The gain of applying ``advice`` (fitted, or a plan's items) together: each slice of the step
    removed once, by the most any of them removes of it, low and high apart (a remedy another of the
    set replaces adds nothing); the run-to-run spread once. With ``replay``, the span of that and of
    the remedies read from the replay replayed together (as each of their ranges spans both: the
    replay's alone where the trace's slices are the profiler's, ReplayGains.slices_hold)."""
    given = list(advice)
    by_slices = _combined(given, spread_ms, None)
    if replay is None:
        return by_slices
    both = _combined(given, spread_ms, replay)
    if not replay.slices_hold:  # the profiler lengthened the trace's gaps: the replay alone
        return both
    return min(by_slices[0], both[0]), max(by_slices[1], both[1])


def _combined(given: Sequence[Advice | PlanItem], spread_ms: float,
              replay: ReplayGains | None) -> tuple[float, float]:
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    replayed, together = _replayed_together(
        [a for a in given if a.replay is not None
         and not any(b is not a and b.replay is None and covers(b, a) for b in given)], replay)
    if together is not None:
        lo["replay"], hi["replay"] = together
    taken = {atom for a in replayed for atom in _atoms(a)}
    for a in given:
        if a in replayed or any(b is not a and b not in replayed and covers(b, a) for b in given):
            continue
        for r in a.removes:
            if r.atom in taken:
                continue
            if r.high_ms < 0 or r.low_ms < 0:  # a remedy's own cost: its own slice, always paid
                lo[f"{_id(a)}/{r.atom}"] = r.low_ms
                hi[f"{_id(a)}/{r.atom}"] = r.high_ms
                continue
            lo[r.atom] = max(lo.get(r.atom, 0.0), r.low_ms)
            hi[r.atom] = max(hi.get(r.atom, 0.0), r.high_ms)
    return sum(lo.values()) - spread_ms, sum(hi.values()) + spread_ms


def _replayed_together(candidates: Sequence[Advice | PlanItem], replay: ReplayGains | None
                       ) -> tuple[list[Advice | PlanItem], tuple[float, float] | None]:
    """The most of ``candidates`` the replay ran together (a change it reads alone, activation
    checkpointing off, has no combination with the rest): the largest set with a combination, of those
    the one that gains most; the others are summed by their slices. None: no set of them replayed."""
    if replay is None:
        return [], None
    for k in range(len(candidates), 0, -1):
        found = [(g, list(s)) for s in itertools.combinations(candidates, k)
                 if (g := replay.of(a.replay for a in s if a.replay is not None)) is not None]
        if found:
            g, chosen = max(found, key=lambda f: (f[0][1], f[0][0]))
            return chosen, g
    return [], None


def _id(a: Advice | PlanItem) -> str:
    return a.remedy if isinstance(a, PlanItem) else a.remedy.value


def _atoms(a: Advice | PlanItem) -> dict[str, Removal]:
    return {r.atom: r for r in a.removes if r.low_ms >= 0 and r.high_ms > 0}


def covers(a: Advice | PlanItem, b: Advice | PlanItem) -> bool:
    """``a`` removes every slice ``b`` does, each as much (taken in the middle of its range, which
    gives to within the run-to-run spread): applied, ``a`` leaves nothing for ``b``."""
    mine, theirs = _atoms(a), _atoms(b)
    return (
        bool(theirs)
        and set(theirs) <= set(mine)
        and all(
            mine[k].low_ms + mine[k].high_ms >= 0.85 * (theirs[k].low_ms + theirs[k].high_ms) for k in theirs
        )
    )


def _replayed_link(a: Advice, b: Advice, replay: ReplayGains | None) -> Link | None:
    """How two remedies read from the replay stand, from the replay of both together: the gain they
    share is what the two alone add to beyond it; one that adds under REPLACED_ADDS of its own gain on
    top of the other is replaced by it."""
    if replay is None or a.replay is None or b.replay is None:
        return None
    ga, gb, gab = replay.of((a.replay,)), replay.of((b.replay,)), replay.of((a.replay, b.replay))
    if ga is None or gb is None or gab is None:
        return None
    shared = (max(ga[0] + gb[0] - gab[0], 0.0), max(ga[1] + gb[1] - gab[1], 0.0))
    mid = sum(shared) / 2
    if mid <= 0:
        return Link(Relation.OVERLAPS, b.remedy.value, None)  # no shared gain: independent
    if sum(gab) / 2 - sum(ga) / 2 < REPLACED_ADDS * sum(gb) / 2:
        return Link(Relation.REPLACES, b.remedy.value, shared)
    if sum(gab) / 2 - sum(gb) / 2 < REPLACED_ADDS * sum(ga) / 2:
        return Link(Relation.REPLACED_BY, b.remedy.value, shared)
    return Link(Relation.OVERLAPS, b.remedy.value, shared)


# one remedy applied on top of another that adds under this share of its own gain is replaced by it
REPLACED_ADDS = 0.15


def relations(a: Advice, others: Sequence[Advice], replay: ReplayGains | None = None) -> tuple[Link, ...]:
    """How ``a`` stands to each of ``others``: it replaces one whose every slice it removes as much of
    (or is replaced by it); it overlaps one it shares slices with (the shared gain, counted once); and
    the packages it requires. Two remedies read from the replay stand as the replay of both says."""
    mine = _atoms(a)
    out: list[Link] = []
    for b in others:
        if b.remedy is a.remedy:
            continue
        if a.replay is not None and b.replay is not None and replay is not None:
            link = _replayed_link(a, b, replay)
            if link is not None:
                if link.shared_ms is not None:
                    out.append(link)
                continue
        theirs = _atoms(b)
        shared = set(mine) & set(theirs)
        if not shared:
            continue
        both = (
            sum(min(mine[k].low_ms, theirs[k].low_ms) for k in shared),
            sum(min(mine[k].high_ms, theirs[k].high_ms) for k in shared),
        )
        rel = (
            Relation.REPLACES if covers(a, b) else Relation.REPLACED_BY if covers(b, a) else Relation.OVERLAPS
        )
        out.append(Link(rel, b.remedy.value, both))
    out += [Link(Relation.REQUIRES, p) for p in a.requires]
    return tuple(out)


def presence(cfg: JobConfig, package: str) -> Presence:
    v = cfg.packages.get(package)
    if v is None:
        return Presence.UNKNOWN
    return Presence.ABSENT if v == ABSENT else Presence.PRESENT


def prerequisites(a: Advice, cfg: JobConfig) -> tuple[Prerequisite, ...]:
    return tuple(Prerequisite(p, presence(cfg, p)) for p in a.requires)


def _to_install(a: Advice) -> tuple[str, ...]:
    """The packages a remedy's install stage installs: those the job lacks, else those its action names."""
    return a.needs or a.installs


def _installs(
    items: Sequence[Advice], spread_ms: float, done: Sequence[Advice], replay: ReplayGains | None = None
) -> list[tuple[tuple[str, ...], list[Advice]]]:
    """The install stages: the package whose install brings the largest combined gain (on top of what is
    done) first, with every remaining item it satisfies; then the next."""
    left = list(items)
    out: list[tuple[tuple[str, ...], list[Advice]]] = []
    applied = list(done)
    while left:
        packages = sorted({p for a in left for p in _to_install(a)})

        cover = {p: [a for a in left if p in _to_install(a) and (a.needs_one or len(_to_install(a)) == 1)]
                 for p in packages}
        best = max(packages, key=lambda p: (combined([*applied, *cover[p]], spread_ms, replay)[0], p),
                   default=None)
        got = cover[best] if best is not None else []
        if not got:  # remedies needing several packages at once
            got, best = [left[0]], None
        pkgs = (best,) if best is not None else tuple(_to_install(left[0]))
        out.append((pkgs, got))
        applied += got
        left = [a for a in left if a not in got]
    return out


def _order(items: Sequence[Advice]) -> list[Advice]:
    """By gain, largest first (its middle, then its high end; the remedy's id settles a tie)."""
    return sorted(items, key=lambda a: (-(a.gain.mid_ms if a.gain else 0.0),
                                        -(a.gain.high_ms if a.gain else 0.0), a.remedy.value))


def make_plan(advice: Sequence[Advice], cfg: JobConfig, step_ms: float, spread_ms: float,
              replay: ReplayGains | None = None) -> Plan | None:
    """The plan of the fitted ``advice`` (None without any). The set a user would apply is every remedy
    whose gain is promised: the flags first (one stage), then one stage per install (the one that brings
    most first), then the code changes; a remedy whose gain is not promised (its range reaches below
    zero, or Gain.risk says why not) is listed apart, to measure (stage -1). ``spread_ms``: the
    run-to-run spread its totals carry once (the same as its items' ranges: remedies.run_spread_ms of
    the budget they were fitted to); ``replay``: the replay's gains the items that name a change were
    read from (FitContext.replay), which combine them. A remedy with no modelled gain is no item: it is
    listed apart (``unmodelled``, with why), since a plan orders remedies by their gains and adds them
    up, and one without a gain has no place in either."""
    if not advice or step_ms <= 0:
        return None
    unmodelled = tuple(Unmodelled(a.remedy.value, "", a.effort, a.no_gain or NoGain.NOT_MODELLED, a.action)
                       for a in advice if a.gain is None)
    advice = [a for a in advice if a.gain is not None]
    promised = [a for a in advice if a.gain is not None and a.gain.promised]
    groups: list[tuple[Effort, tuple[str, ...], list[Advice]]] = []
    flags = _order([a for a in promised if a.effort is Effort.FLAG])
    if flags:
        groups.append((Effort.FLAG, (), flags))
    installs = [a for a in promised if a.effort is Effort.INSTALL]
    for pkgs, got in _installs(installs, spread_ms, flags, replay):
        groups.append((Effort.INSTALL, pkgs, _order(got)))
    code = _order([a for a in promised if a.effort is Effort.CODE])
    if code:
        groups.append((Effort.CODE, (), code))
    stages: list[PlanStage] = []
    applied: list[Advice] = []
    stage_of: dict[str, int] = {}
    before: tuple[float, float] | None = None
    for effort, pkgs, got in groups:
        total = combined([*applied, *got], spread_ms, replay)
        # every total carries the run-to-run spread once: a later stage's own gain is the difference
        gain = total if before is None else (total[0] - before[0], total[1] - before[1])
        stages.append(PlanStage(effort, tuple(a.remedy.value for a in got), gain, total, pkgs))
        for a in got:
            stage_of[a.remedy.value] = len(stages) - 1
        applied += got
        before = total
    ordered = [a for _e, _p, got in groups for a in got]
    rest = [a for a in advice if a not in ordered]  # not in the set: by effort, then by gain within it
    for effort in sorted(Effort, key=lambda e: e.rank):
        ordered += _order([a for a in rest if a.effort is effort])
    items = []
    for a in ordered:
        links = relations(a, ordered, replay)
        st = stage_of.get(a.remedy.value, -1)
        moot = (
            next(
                (
                    b.remedy.value
                    for b in ordered
                    if b is not a and _replaces(b, a, replay) and 0 <= stage_of.get(b.remedy.value, -1) <= st
                ),
                None,
            )
            if st >= 0
            else None
        )
        items.append(
            PlanItem(
                a.remedy.value,
                "",
                a.effort,
                (a.gain.low_ms, a.gain.high_ms) if a.gain else None,
                st,
                links,
                prerequisites(a, cfg),
                moot,
                tuple(f.text() for f in a.flags),
                a.remove,
                a.needs_one and len(a.requires) > 1,
                a.removes,
                a.replay,
                a.action,
                a.gain.risk if a.gain else None,
            )
        )
    return Plan(step_ms, tuple(items), tuple(stages), spread_ms, replay, unmodelled)


def _replaces(b: Advice, a: Advice, replay: ReplayGains | None) -> bool:
    link = _replayed_link(b, a, replay)
    return link.relation is Relation.REPLACES if link is not None else covers(b, a)
