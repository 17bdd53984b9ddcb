"""Load and validate rule packs (YAML), reporting every error with its file and line.

The YAML is *composed* (PyYAML node tree, which keeps each node's line) and validated node by
node, so ``perfd rules check`` can print all the problems of a file at once as
``FILE:LINE: rule NAME: reason``; a plain ``yaml.safe_load`` would lose the lines and silently keep
the last of two duplicate keys.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar, cast

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from perfd.core import catalog
from perfd.rules.expr import Expr, ExprError, compile_expr
from perfd.rules.rule_types import (
    DEFAULT_COOLDOWN_S,
    DEFAULT_DISK_QUOTA_BYTES,
    DEFAULT_MAX_PER_HOUR,
    DEFAULT_STEPS,
    SCOPE_LABELS,
    SCOPES,
    SEVERITIES,
    TOOLS,
    Action,
    AlertAction,
    Annotations,
    CaptureAction,
    CaptureTargets,
    Rule,
    RuleError,
    RulePack,
    RulePackError,
    Scope,
    Severity,
    Tool,
    carrying_scopes,
    parse_bytes,
    parse_duration,
)

PACK_KEYS = ("rules",)
RULE_KEYS = ("name", "expr", "for", "severity", "labels", "annotations", "scope", "action", "override")
ANNOTATION_KEYS = ("summary", "description", "recommendation", "runbook_url")
CAPTURE_KEYS = ("type", "tool", "targets", "steps", "cooldown", "max_per_hour", "disk_quota", "stack")
TARGET_KEYS = ("slowest_rank", "pp_stage", "ranks", "node", "incident_ranks")

# Rule names end up in labels, events and capture directory names: keep them plain.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]*")
_LABEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

T = TypeVar("T")


def _line(node: Node) -> int:
    return int(node.start_mark.line) + 1


def _scalar(node: ScalarNode) -> Any:
    # The composer already resolved the tag (int, float, bool, null, str); construct just this node.
    return SafeConstructor().construct_object(node, deep=True)


class _Ctx:
    """Collects errors for one file; ``rule`` names the rule being validated."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rule: str | None = None
        self.errors: list[RuleError] = []
        self.warnings: list[RuleError] = []

    def err(self, node: Node | int | None, message: str) -> None:
        line = node if isinstance(node, int) or node is None else _line(node)
        self.errors.append(RuleError(self.path, line, self.rule, message))

    def warn(self, node: Node | int | None, message: str) -> None:
        """A rule that loads but cannot do what it says (it never fires)."""
        line = node if isinstance(node, int) or node is None else _line(node)
        self.warnings.append(RuleError(self.path, line, self.rule, f"warning: {message}"))

    def mapping(self, node: Node, what: str, allowed: tuple[str, ...]) -> dict[str, tuple[Node, Node]] | None:
        """Keys of a mapping node → (key node, value node); reports non-mappings, unknown and
        duplicate keys (all of them)."""
        if not isinstance(node, MappingNode):
            self.err(node, f"{what} must be a mapping")
            return None
        out: dict[str, tuple[Node, Node]] = {}
        for k, v in node.value:
            key = _scalar(k) if isinstance(k, ScalarNode) else None
            if not isinstance(key, str):
                self.err(k, f"{what}: keys must be strings")
                continue
            if key in out:
                self.err(k, f"{what}: duplicate key {key!r} (first at line {_line(out[key][0])})")
                continue
            if key not in allowed:
                self.err(k, f"{what}: unknown key {key!r} (allowed: {', '.join(allowed)})")
                continue
            out[key] = (k, v)
        return out

    def scalar(self, node: Node, what: str, kinds: tuple[type, ...]) -> Any:
        """A scalar of one of ``kinds`` (bool is never accepted as a number), else an error + None."""
        value = _scalar(node) if isinstance(node, ScalarNode) else None
        ok = isinstance(node, ScalarNode) and isinstance(value, kinds) and not (
            isinstance(value, bool) and bool not in kinds)
        if not ok:
            self.err(node, f"{what} must be {_kinds(kinds)}, not {_describe(node, value)}")
            return None
        return value

    def enum(self, node: Node, what: str, choices: tuple[str, ...]) -> str | None:
        value = self.scalar(node, what, (str,))
        if value is not None and value not in choices:
            self.err(node, f"{what} must be one of {', '.join(choices)}, not {value!r}")
            return None
        return value  # type: ignore[no-any-return]

    def convert(self, node: Node, what: str, fn: Callable[[Any], T]) -> T | None:
        value = self.scalar(node, what, (str, int, float))
        if value is None:
            return None
        try:
            return fn(value)
        except ValueError as e:
            self.err(node, f"{what}: {e}")
            return None


_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}


def _kinds(kinds: tuple[type, ...]) -> str:
    names = [_KIND_NAMES.get(k, k.__name__) for k in kinds]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _describe(node: Node, value: object) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    if isinstance(node, SequenceNode):
        return "a list"
    return "null" if value is None else repr(value)


# --- rule parts -------------------------------------------------------------------------------
def _expr_position(node: ScalarNode, column: int) -> tuple[int, int]:
    """File line and column-in-that-line of an expression error at 1-based ``column`` of the text.

    A literal block (|) keeps its newlines, so the offending line is exact; other multi-line styles
    fold lines together and only the start line is known (the column is then within the text).
    """
    if node.style == "|":
        text: str = node.value
        before = text[: max(column - 1, 0)]
        return _line(node) + 1 + before.count("\n"), column - (before.rfind("\n") + 1)
    return _line(node), column


def _parse_expr(ctx: _Ctx, node: Node, scope: Scope) -> Expr | None:
    text = ctx.scalar(node, "expr", (str,))
    if text is None:
        return None
    assert isinstance(node, ScalarNode)
    try:
        expr = compile_expr(text)
    except ExprError as e:
        line, col = _expr_position(node, e.column)
        ctx.err(line, f"expr: {e.message} (column {col})")
        return None
    for name in sorted(expr.metrics):
        metric = catalog.get(name)
        have = frozenset(metric.labels) & SCOPE_LABELS["rank"]
        if not have <= SCOPE_LABELS[scope]:
            need = "rank" if "rank" in have else "gpu"
            ctx.err(node, f"expr: {name} (labels {', '.join(sorted(have))}) is not available at scope "
                          f"{scope}; use scope: {need}")
            continue
        # Accepted by its labels, yet absent at this scope on the aggregator: the rule would load and
        # never fire (a value that is absent never fires), so say so.
        scopes, why = carrying_scopes(metric)
        if not scopes:
            ctx.warn(node, f"expr: {name} is in no rule scope, so this rule never fires: {why}")
        elif scope not in scopes:
            ctx.warn(node, f"expr: {name} is not in the {scope} scope, so this rule never fires; it is in "
                           f"the {' and '.join(sorted(scopes))} scope (use scope: {sorted(scopes)[0]})")
    return expr


def _parse_labels(ctx: _Ctx, node: Node) -> dict[str, str]:
    if not isinstance(node, MappingNode):
        ctx.err(node, "labels must be a mapping of name: value")
        return {}
    out: dict[str, str] = {}
    for k, v in node.value:
        key = _scalar(k) if isinstance(k, ScalarNode) else None
        if not isinstance(key, str) or not _LABEL_RE.fullmatch(key):
            ctx.err(k, f"labels: invalid label name {key!r}")
            continue
        if key in out:
            ctx.err(k, f"labels: duplicate label {key!r}")
            continue
        value = ctx.scalar(v, f"labels.{key}", (str, int, float, bool))
        if value is not None:
            out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _parse_annotations(ctx: _Ctx, node: Node) -> Annotations:
    keys = ctx.mapping(node, "annotations", ANNOTATION_KEYS)
    if keys is None:
        return Annotations()
    values: dict[str, str] = {}
    for key, (_, v) in keys.items():
        text = ctx.scalar(v, f"annotations.{key}", (str,))
        if text is not None:
            values[key] = text.strip()
    return Annotations(**values)


def _parse_targets(ctx: _Ctx, node: Node) -> CaptureTargets | None:
    keys = ctx.mapping(node, "action.targets", TARGET_KEYS)
    if keys is None:
        return None
    if len(keys) != 1:
        ctx.err(node, f"action.targets must name exactly one of {', '.join(TARGET_KEYS)}")
        return None
    (key, (_, v)), = keys.items()
    if key == "slowest_rank":
        flag = ctx.scalar(v, "action.targets.slowest_rank", (bool,))
        if flag is False:
            ctx.err(v, "action.targets.slowest_rank must be true (name other targets instead)")
        return CaptureTargets(slowest_rank=True) if flag else None
    if key == "incident_ranks":
        flag = ctx.scalar(v, "action.targets.incident_ranks", (bool,))
        if flag is False:
            ctx.err(v, "action.targets.incident_ranks must be true (name other targets instead)")
        return CaptureTargets(incident_ranks=True) if flag else None
    if key == "pp_stage":
        stage = ctx.scalar(v, "action.targets.pp_stage", (int,))
        if stage is not None and stage < 0:
            ctx.err(v, "action.targets.pp_stage must be >= 0")
            return None
        return None if stage is None else CaptureTargets(pp_stage=stage)
    if key == "node":
        name = ctx.scalar(v, "action.targets.node", (str,))
        if name is not None and not name.strip():
            ctx.err(v, "action.targets.node must not be empty")
            return None
        return None if not name else CaptureTargets(node=name)
    if not isinstance(v, SequenceNode) or not v.value:
        ctx.err(v, "action.targets.ranks must be a non-empty list of ranks")
        return None
    ranks: list[int] = []
    for item in v.value:
        r = ctx.scalar(item, "action.targets.ranks[]", (int,))
        if r is not None and r < 0:
            ctx.err(item, "action.targets.ranks: ranks are >= 0")
        elif r is not None:
            ranks.append(r)
    if len(ranks) != len(v.value):
        return None
    return CaptureTargets(ranks=tuple(sorted(set(ranks))))


def _parse_action(ctx: _Ctx, node: Node) -> Action | None:
    if not isinstance(node, MappingNode):
        ctx.err(node, "action must be a mapping with a type (alert or capture)")
        return None
    type_node = next((v for k, v in node.value if isinstance(k, ScalarNode) and k.value == "type"), None)
    if type_node is None:
        ctx.err(node, "action needs a type: alert or capture")
        return None
    kind = ctx.enum(type_node, "action.type", ("alert", "capture"))
    if kind is None:
        return None
    if kind == "alert":
        ctx.mapping(node, "action (type alert)", ("type",))
        return AlertAction()
    keys = ctx.mapping(node, "action (type capture)", CAPTURE_KEYS)
    if keys is None:
        return None
    ok = True

    def get(key: str, fn: Callable[[Node], T | None], default: T) -> T:
        nonlocal ok
        if key not in keys:
            return default
        value = fn(keys[key][1])
        if value is None:
            ok = False
            return default
        return value

    def positive_int(what: str) -> Callable[[Node], int | None]:
        def parse(n: Node) -> int | None:
            v = ctx.scalar(n, what, (int,))
            if v is not None and v < 1:
                ctx.err(n, f"{what} must be >= 1, not {v}")
                return None
            return v  # type: ignore[no-any-return]
        return parse

    def quota(n: Node) -> int | None:
        v = ctx.convert(n, "action.disk_quota", parse_bytes)
        if v is not None and v <= 0:
            ctx.err(n, "action.disk_quota must be positive")
            return None
        return v

    tool = cast(Tool, get("tool", lambda n: ctx.enum(n, "action.tool", TOOLS), "auto"))
    targets = get("targets", lambda n: _parse_targets(ctx, n), CaptureTargets(slowest_rank=True))
    steps = get("steps", positive_int("action.steps"), DEFAULT_STEPS)
    cooldown = get("cooldown", lambda n: ctx.convert(n, "action.cooldown", parse_duration),
                   DEFAULT_COOLDOWN_S)
    per_hour = get("max_per_hour", positive_int("action.max_per_hour"), DEFAULT_MAX_PER_HOUR)
    disk = get("disk_quota", quota, DEFAULT_DISK_QUOTA_BYTES)
    stack = get("stack", lambda n: ctx.scalar(n, "action.stack", (bool,)), False)
    if not ok:
        return None
    return CaptureAction(tool=tool, targets=targets, steps=steps, cooldown_s=cooldown, max_per_hour=per_hour,
                         disk_quota_bytes=disk, stack=bool(stack))


def _parse_rule(ctx: _Ctx, node: Node, index: int, seen: dict[str, int]) -> Rule | None:
    ctx.rule = f"#{index + 1}"
    if not isinstance(node, MappingNode):
        ctx.err(node, "a rule must be a mapping (name, expr, ...)")
        return None
    # Name first, so every later message carries it.
    name: str | None = None
    for k, v in node.value:
        if isinstance(k, ScalarNode) and k.value == "name":
            raw = _scalar(v) if isinstance(v, ScalarNode) else None
            if isinstance(raw, str) and _NAME_RE.fullmatch(raw):
                name = raw
                ctx.rule = raw
            else:
                ctx.err(v, f"name must be letters, digits, '_', '.', ':' or '-', not {_describe(v, raw)}")
            break
    else:
        ctx.err(node, "missing 'name'")
    before = len(ctx.errors)
    keys = ctx.mapping(node, "rule", RULE_KEYS)
    if keys is None:
        return None
    if name is not None:
        if name in seen:
            ctx.err(keys["name"][1], f"duplicate rule name {name!r} (first at line {seen[name]})")
        else:
            seen[name] = _line(node)

    scope: Scope = "job"
    if "scope" in keys:
        scope = ctx.enum(keys["scope"][1], "scope", SCOPES) or "job"  # type: ignore[assignment]
    expr: Expr | None = None
    if "expr" not in keys:
        ctx.err(node, "missing 'expr'")
    else:
        expr = _parse_expr(ctx, keys["expr"][1], scope)
    for_s = 0.0
    if "for" in keys:
        for_s = ctx.convert(keys["for"][1], "for", parse_duration) or 0.0
    severity: Severity = "warning"
    if "severity" in keys:
        severity = ctx.enum(keys["severity"][1], "severity", SEVERITIES) or "warning"  # type: ignore[assignment]
    labels = _parse_labels(ctx, keys["labels"][1]) if "labels" in keys else {}
    annotations = _parse_annotations(ctx, keys["annotations"][1]) if "annotations" in keys else Annotations()
    action: Action | None = AlertAction()
    if "action" in keys:
        action = _parse_action(ctx, keys["action"][1])
    override = bool(ctx.scalar(keys["override"][1], "override", (bool,))) if "override" in keys else False
    if len(ctx.errors) != before or name is None or expr is None or action is None:
        return None
    return Rule(name=name, expr=expr, for_s=for_s, severity=severity, labels=labels, annotations=annotations,
                scope=scope, action=action, origin=f"{ctx.path}:{_line(node)}", override=override)


# --- packs ------------------------------------------------------------------------------------
MAX_YAML_DEPTH = 32  # a pack is a few levels deep; PyYAML's composer recurses once per level


class _DepthLimitedLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting past MAX_YAML_DEPTH with a YAML error (a 5,000-deep ``[[[``
    raised RecursionError). Aliases are composed once, so billion-laughs stays cheap."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_pack(text: str, path: str = "<string>") -> tuple[RulePack | None, list[RuleError]]:
    """Validate a pack's text. Returns the pack (None when there are errors) and every error."""
    pack, errors, _warnings = parse_pack_checked(text, path)
    return pack, errors


def parse_pack_checked(text: str, path: str = "<string>"
                       ) -> tuple[RulePack | None, list[RuleError], list[RuleError]]:
    """:func:`parse_pack`, and the warnings: rules that load but read a series their scope never
    holds on the aggregator (:func:`perfd.rules.rule_types.carrying_scopes`)."""
    ctx = _Ctx(path)
    pack = _parse_pack(ctx, text)
    return pack, ctx.errors, ctx.warnings


def _parse_pack(ctx: _Ctx, text: str) -> RulePack | None:
    path = ctx.path
    try:
        root = yaml.compose(text, Loader=_DepthLimitedLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        ctx.err(mark.line + 1 if mark else None, f"YAML: {e.problem or e}")
        return None
    except yaml.YAMLError as e:
        ctx.err(None, f"YAML: {e}")
        return None
    if root is None:
        ctx.err(1, "empty pack: expected a mapping with a 'rules' list")
        return None
    top = ctx.mapping(root, "pack", PACK_KEYS)
    if top is None:
        return None
    if "rules" not in top:
        ctx.err(root, "missing 'rules' (a list of rules)")
        return None
    seq = top["rules"][1]
    if not isinstance(seq, SequenceNode):
        ctx.err(seq, "'rules' must be a list")
        return None
    seen: dict[str, int] = {}
    rules = [_parse_rule(ctx, item, i, seen) for i, item in enumerate(seq.value)]
    if ctx.errors:
        return None
    return RulePack(Path(path).stem, path, tuple(r for r in rules if r is not None))


def read_pack(path: Path) -> tuple[str | None, RuleError | None]:
    """A pack's text, or the error that says why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8"), None
    except (OSError, UnicodeDecodeError) as e:
        return None, RuleError(str(path), None, None, f"cannot read: {e}")


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given; a directory stands for its *.yaml / *.yml files, sorted."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(x for x in p.iterdir() if x.suffix in (".yaml", ".yml")))
        else:
            out.append(p)
    return out


def check_files(paths: Iterable[str | Path]) -> list[RuleError]:
    """Every error of every file (directories expand to their YAML files)."""
    return check_files_warned(paths)[0]


def check_files_warned(paths: Iterable[str | Path]) -> tuple[list[RuleError], list[RuleError]]:
    """Every error and every warning of every file (directories expand to their YAML files)."""
    errors: list[RuleError] = []
    warnings: list[RuleError] = []
    for p in expand_paths(paths):
        text, err = read_pack(p)
        if err is not None:
            errors.append(err)
            continue
        assert text is not None
        _pack, errs, warns = parse_pack_checked(text, str(p))
        errors.extend(errs)
        warnings.extend(warns)
    return errors, warnings


def load_pack(path: str | Path) -> RulePack:
    """A validated pack; raises RulePackError carrying all errors."""
    p = Path(path)
    text, err = read_pack(p)
    if err is not None:
        raise RulePackError([err])
    assert text is not None
    pack, errors = parse_pack(text, str(p))
    if pack is None:
        raise RulePackError(errors)
    return pack


def default_pack_path(name: str = "default.yaml") -> Path:
    """A shipped pack: ``rules/NAME`` beside the ``perfd`` package (a source checkout), else the copy
    an installed wheel puts under ``<prefix>/share/perfd/rules/`` (pyproject's data-files). Returns
    the first that exists, or the checkout path (whose absence the caller reports)."""
    checkout = Path(__file__).resolve().parents[2] / "rules" / name
    if checkout.is_file():
        return checkout
    installed = Path(sys.prefix) / "share" / "perfd" / "rules" / name
    return installed if installed.is_file() else checkout
