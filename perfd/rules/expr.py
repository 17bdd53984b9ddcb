"""A small, safe condition language for rules: tokenizer, recursive-descent parser, typed AST.

No Python ``eval``/``exec``/``ast`` anywhere: a rule pack is input, not code. A condition is parsed
once into a tree of small dataclasses and evaluated many times over a mapping of series key →
value. Grammar (lowest precedence first)::

    expr    := or
    or      := and ('or' and)*
    and     := not ('and' not)*
    not     := 'not' not | cmp
    cmp     := sum (('<' | '<=' | '>' | '>=' | '==' | '!=') sum)?     # no chaining
    sum     := term (('+' | '-') term)*
    term    := unary (('*' | '/') unary)*
    unary   := ('-' | '+') unary | primary
    primary := NUMBER [unit] | metric [selector] | FUNC '(' expr (',' expr)* ')' | '(' expr ')'
    selector:= '{' label '=' "value" (',' label '=' "value")* '}'

Numbers take a unit suffix written right after them (``30%``, ``5m``, ``2GiB``, ``1.5GHz``) and are
converted to the catalog's base units (ratios, seconds, bytes, hertz). Metric identifiers are catalog
names or the short aliases in :data:`ALIASES`. A labelled series (``perfd_gpu_throttle_active
{reason="hw_thermal"}``) is looked up under the key :func:`series_key` builds.

Absent values (docs/design.md §2: metrics are never invented): arithmetic on an absent value is absent, a
comparison involving one is *unknown*, and ``not``/``and``/``or`` follow three-valued (Kleene) logic,
so ``not (mfu < 30%)`` does not fire when MFU is absent either. Only a definite True fires a rule.
``absent(x)`` / ``present(x)`` are the way to test for a missing value.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from perfd.core import catalog

Values = Mapping[str, float | None]
Tri = bool | None  # three-valued truth: None = unknown (an absent input)


class ExprError(ValueError):
    """A condition that does not parse or type-check. ``column`` is 1-based within the text."""

    def __init__(self, message: str, column: int) -> None:
        super().__init__(f"column {column}: {message}")
        self.message = message
        self.column = column


# --- units -----------------------------------------------------------------------------------
# Multipliers to the catalog's base units. Case matters: "m" is minutes, "M" is not a unit (it
# would be ambiguous between mega and minutes).
TIME_UNITS: dict[str, float] = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
                                 "d": 86400.0}
BYTE_UNITS: dict[str, float] = {"B": 1.0, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2.0**10,
                                 "MiB": 2.0**20, "GiB": 2.0**30, "TiB": 2.0**40}
UNITS: dict[str, float] = {
    "%": 0.01, "x": 1.0,
    **TIME_UNITS, **BYTE_UNITS,
    "Hz": 1.0, "kHz": 1e3, "MHz": 1e6, "GHz": 1e9,
    "W": 1.0, "kW": 1e3, "C": 1.0,
}

# --- metric names and aliases ------------------------------------------------------------------
# Throttle reasons as the NVML collector labels them (collectors/nvml THROTTLE_REASONS; a test keeps
# the two lists equal — the rules engine must not import collectors).
THROTTLE_REASONS: tuple[str, ...] = ("gpu_idle", "applications_clocks", "sw_power_cap", "hw_slowdown",
                                     "sync_boost", "sw_thermal", "hw_thermal", "hw_power_brake",
                                     "display_clocks")


def series_key(name: str, labels: Mapping[str, str] | None = None) -> str:
    """The key a series is looked up under: ``name`` or ``name{a="x",b="y"}`` (labels sorted).

    Only labels beyond the scope's own belong here: job_name, rank, node and gpu are the scope key.
    """
    if not labels:
        return name
    inner = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
    return f"{name}{{{inner}}}"


def base_name(key: str) -> str:
    """The metric name of a series key (drops the label selector)."""
    return key.split("{", 1)[0]


# Short alias -> series key: the catalog's aliases (declared with each metric), plus aliases of one
# labelled series (an ECC error type, a throttle reason), which no single catalog entry can name.
ALIASES: dict[str, str] = {
    **catalog.aliases(),
    "ecc_corrected": series_key("perfd_gpu_ecc_errors_total", {"type": "corrected"}),
    "ecc_uncorrected": series_key("perfd_gpu_ecc_errors_total", {"type": "uncorrected"}),
    **{f"throttle_{r}": series_key(catalog.GPU_THROTTLE_ACTIVE, {"reason": r}) for r in THROTTLE_REASONS},
}

# Labels that identify the scope (and so never appear in a series key).
SCOPE_LABELS: frozenset[str] = frozenset({"job_name", "rank", "node", "gpu"})


def default_resolve(name: str, column: int) -> str:
    """Catalog name or alias → series key; ExprError (with a suggestion) for anything else."""
    if name in ALIASES:
        return ALIASES[name]
    try:
        catalog.get(name)
    except KeyError:
        known = [*ALIASES, *catalog.names()]
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ExprError(f"unknown metric or alias {name!r}{hint}", column) from None
    return name


Resolver = Callable[[str, int], str]


# --- tokens -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Token:
    kind: str  # "num", "ident", "str", "op", "end"
    text: str
    pos: int  # 0-based offset
    value: float = 0.0


_OPS2 = ("<=", ">=", "==", "!=")
_OPS1 = "<>()+-*/,{}="
_NUM_RE = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_UNIT_RE = re.compile(r"%|[A-Za-z]+")


def tokenize(text: str) -> list[Token]:
    toks: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        m = _NUM_RE.match(text, i)
        if m:
            value = float(m.group())
            j = m.end()
            u = _UNIT_RE.match(text, j)
            if u:
                if u.group() not in UNITS:
                    raise ExprError(f"unknown unit {u.group()!r} after number", j + 1)
                value *= UNITS[u.group()]
                j = u.end()
            toks.append(Token("num", text[i:j], i, value))
            i = j
            continue
        m = _IDENT_RE.match(text, i)
        if m:
            toks.append(Token("ident", m.group(), i))
            i = m.end()
            continue
        if c == '"':
            j = text.find('"', i + 1)
            if j < 0:
                raise ExprError("unterminated string", i + 1)
            toks.append(Token("str", text[i + 1:j], i))
            i = j + 1
            continue
        if text[i:i + 2] in _OPS2:
            toks.append(Token("op", text[i:i + 2], i))
            i += 2
            continue
        if c in _OPS1:
            toks.append(Token("op", c, i))
            i += 1
            continue
        raise ExprError(f"unexpected character {c!r}", i + 1)
    toks.append(Token("end", "", n))
    return toks


# --- AST --------------------------------------------------------------------------------------
# Two node families, checked at parse time: numeric nodes give float | None (None = absent),
# boolean nodes give Tri (None = unknown because an input was absent).
class NumNode:
    pos: int

    def value(self, values: Values) -> float | None:
        raise NotImplementedError


class BoolNode:
    pos: int

    def truth(self, values: Values) -> Tri:
        raise NotImplementedError


@dataclass(frozen=True)
class Num(NumNode):
    number: float
    pos: int

    def value(self, values: Values) -> float | None:
        return self.number


@dataclass(frozen=True)
class Metric(NumNode):
    key: str
    pos: int

    def value(self, values: Values) -> float | None:
        v = values.get(self.key)
        # NaN carries no information: treat it as absent rather than let it compare False silently.
        return None if v is None or math.isnan(v) else float(v)


@dataclass(frozen=True)
class Neg(NumNode):
    operand: NumNode
    pos: int

    def value(self, values: Values) -> float | None:
        v = self.operand.value(values)
        return None if v is None else -v


@dataclass(frozen=True)
class Arith(NumNode):
    op: str
    left: NumNode
    right: NumNode
    pos: int

    def value(self, values: Values) -> float | None:
        a, b = self.left.value(values), self.right.value(values)
        if a is None or b is None:
            return None
        if self.op == "+":
            return a + b
        if self.op == "-":
            return a - b
        if self.op == "*":
            return a * b
        return None if b == 0 else a / b  # x/0 is not a number we can act on: absent


@dataclass(frozen=True)
class Func(NumNode):
    name: str  # abs | min | max
    args: tuple[NumNode, ...]
    pos: int

    def value(self, values: Values) -> float | None:
        xs = [a.value(values) for a in self.args]
        present = [x for x in xs if x is not None]
        if len(present) != len(xs):
            return None  # min(a, absent) is not a, it is unknown
        if self.name == "abs":
            return abs(present[0])
        return min(present) if self.name == "min" else max(present)


_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b,
}


@dataclass(frozen=True)
class Compare(BoolNode):
    op: str
    left: NumNode
    right: NumNode
    pos: int

    def truth(self, values: Values) -> Tri:
        a, b = self.left.value(values), self.right.value(values)
        if a is None or b is None:
            return None
        return _COMPARE[self.op](a, b)


@dataclass(frozen=True)
class Presence(BoolNode):
    present: bool  # present(x) if True, absent(x) if False
    operand: NumNode
    pos: int

    def truth(self, values: Values) -> Tri:
        return (self.operand.value(values) is not None) == self.present


@dataclass(frozen=True)
class Not(BoolNode):
    operand: BoolNode
    pos: int

    def truth(self, values: Values) -> Tri:
        t = self.operand.truth(values)
        return None if t is None else not t


@dataclass(frozen=True)
class Logic(BoolNode):
    op: str  # and | or
    items: tuple[BoolNode, ...]
    pos: int

    def truth(self, values: Values) -> Tri:
        # Kleene: "and" is False if any is False, "or" True if any is True, else unknown if any is.
        decisive = self.op == "or"
        unknown = False
        for item in self.items:
            t = item.truth(values)
            if t is None:
                unknown = True
            elif t == decisive:
                return decisive
        return None if unknown else not decisive


Node = NumNode | BoolNode

_FUNCS: dict[str, tuple[int, int | None]] = {  # name -> (min args, max args)
    "abs": (1, 1), "min": (2, None), "max": (2, None), "absent": (1, 1), "present": (1, 1),
}
_KEYWORDS = frozenset({"and", "or", "not"})


# --- parser -----------------------------------------------------------------------------------
# Limits that keep a hostile or generated expression from exhausting the stack: the parser and
# the evaluator both recurse once per nesting level (a 1,000-deep expression raised
# RecursionError), and an operator chain becomes a tree as deep as it is long.
MAX_EXPR_DEPTH = 32  # nested parentheses, calls, 'not' and unary signs
MAX_EXPR_TOKENS = 256  # a rule longer than this is not something a person reads


class _Parser:
    def __init__(self, text: str, resolve: Resolver) -> None:
        self.text = text
        self.toks = tokenize(text)
        if len(self.toks) > MAX_EXPR_TOKENS + 1:  # + the end token
            raise ExprError(f"expression too long: {len(self.toks) - 1} tokens, at most {MAX_EXPR_TOKENS}",
                            self.toks[MAX_EXPR_TOKENS].pos + 1)
        self.depth = 0
        self.i = 0
        self.resolve = resolve
        self.keys: list[str] = []

    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def advance(self) -> Token:
        t = self.toks[self.i]
        self.i += 1
        return t

    def at(self, text: str) -> bool:
        return self.tok.kind in ("op", "ident") and self.tok.text == text

    def expect(self, text: str, what: str) -> Token:
        if not self.at(text):
            raise ExprError(f"expected {what}, found {self._describe(self.tok)}", self.tok.pos + 1)
        return self.advance()

    @staticmethod
    def _describe(t: Token) -> str:
        return "end of expression" if t.kind == "end" else repr(t.text)

    # Type helpers: the error points at the operand that has the wrong type.
    @staticmethod
    def num(node: Node, context: str) -> NumNode:
        if not isinstance(node, NumNode):
            raise ExprError(f"{context} needs a number, not a condition", node.pos + 1)
        return node

    @staticmethod
    def cond(node: Node, context: str) -> BoolNode:
        if not isinstance(node, BoolNode):
            raise ExprError(f"{context} needs a condition (a comparison), not a number", node.pos + 1)
        return node

    def parse(self) -> BoolNode:
        if self.tok.kind == "end":
            raise ExprError("empty expression", 1)
        node = self.parse_or()
        if self.tok.kind != "end":
            t = self.tok
            if t.kind == "op" and t.text == ")":
                raise ExprError("unbalanced ')'", t.pos + 1)
            raise ExprError(f"unexpected {self._describe(t)}", t.pos + 1)
        return self.cond(node, "a rule expression")

    def parse_or(self) -> Node:
        return self._nested(lambda: self._logic("or", self.parse_and))

    def _nested(self, sub: Callable[[], Node]) -> Node:
        """Every recursion of the grammar goes through here, so its depth is bounded."""
        self.depth += 1
        try:
            if self.depth > MAX_EXPR_DEPTH:
                raise ExprError(f"expression nested deeper than {MAX_EXPR_DEPTH} levels", self.tok.pos + 1)
            return sub()
        finally:
            self.depth -= 1

    def parse_and(self) -> Node:
        return self._logic("and", self.parse_not)

    def _logic(self, op: str, sub: Callable[[], Node]) -> Node:
        first = sub()
        if not self.at(op):
            return first
        items = [self.cond(first, f"'{op}'")]
        while self.at(op):
            self.advance()
            items.append(self.cond(sub(), f"'{op}'"))
        return Logic(op, tuple(items), first.pos)

    def parse_not(self) -> Node:
        if self.at("not"):
            t = self.advance()
            return Not(self.cond(self._nested(self.parse_not), "'not'"), t.pos)
        return self.parse_cmp()

    def parse_cmp(self) -> Node:
        left = self.parse_sum()
        t = self.tok
        if t.kind == "op" and t.text in _COMPARE:
            self.advance()
            right = self.parse_sum()
            nxt = self.tok
            if nxt.kind == "op" and nxt.text in _COMPARE:
                raise ExprError("comparisons cannot be chained; use 'and'", nxt.pos + 1)
            return Compare(t.text, self.num(left, f"'{t.text}'"), self.num(right, f"'{t.text}'"), left.pos)
        return left

    def parse_sum(self) -> Node:
        return self._arith("+-", self.parse_term)

    def parse_term(self) -> Node:
        return self._arith("*/", self.parse_unary)

    def _arith(self, ops: str, sub: Callable[[], Node]) -> Node:
        node = sub()
        while self.tok.kind == "op" and self.tok.text in ops:
            t = self.advance()
            right = sub()
            node = Arith(t.text, self.num(node, f"'{t.text}'"), self.num(right, f"'{t.text}'"), node.pos)
        return node

    def parse_unary(self) -> Node:
        if self.tok.kind == "op" and self.tok.text in "+-":
            t = self.advance()
            operand = self.num(self._nested(self.parse_unary), f"unary '{t.text}'")
            return Neg(operand, t.pos) if t.text == "-" else operand
        return self.parse_primary()

    def parse_primary(self) -> Node:
        t = self.tok
        if t.kind == "num":
            self.advance()
            return Num(t.value, t.pos)
        if t.kind == "op" and t.text == "(":
            self.advance()
            node = self.parse_or()
            if not self.at(")"):
                raise ExprError(f"unbalanced '(': expected ')', found {self._describe(self.tok)}",
                                t.pos + 1)
            self.advance()
            # Keep the parenthesis position so type errors point at the group.
            return _with_pos(node, t.pos)
        if t.kind == "ident":
            if t.text in _KEYWORDS:
                raise ExprError(f"unexpected keyword {t.text!r}", t.pos + 1)
            self.advance()
            if self.at("("):
                return self.parse_call(t)
            return self.parse_metric(t)
        if t.kind == "end":
            raise ExprError("unexpected end of expression", t.pos + 1)
        if t.kind == "op" and t.text == ")":
            raise ExprError("unbalanced ')'", t.pos + 1)
        raise ExprError(f"unexpected {self._describe(t)}", t.pos + 1)

    def parse_call(self, name: Token) -> Node:
        if name.text not in _FUNCS:
            raise ExprError(f"unknown function {name.text!r} (known: {', '.join(sorted(_FUNCS))})",
                            name.pos + 1)
        open_tok = self.advance()
        args: list[NumNode] = []
        if not self.at(")"):
            while True:
                args.append(self.num(self.parse_or(), f"{name.text}()"))
                if not self.at(","):
                    break
                self.advance()
        if not self.at(")"):
            raise ExprError(f"unbalanced '(': expected ')' or ',', found {self._describe(self.tok)}",
                            open_tok.pos + 1)
        self.advance()
        lo, hi = _FUNCS[name.text]
        if len(args) < lo or (hi is not None and len(args) > hi):
            want = f"{lo}" if lo == hi else f"at least {lo}"
            raise ExprError(f"{name.text}() takes {want} argument(s), got {len(args)}", name.pos + 1)
        if name.text in ("absent", "present"):
            return Presence(name.text == "present", args[0], name.pos)
        return Func(name.text, tuple(args), name.pos)

    def parse_metric(self, name: Token) -> Node:
        key = self.resolve(name.text, name.pos + 1)
        if self.at("{"):
            if "{" in key:
                raise ExprError(f"{name.text!r} already selects labels ({key})", self.tok.pos + 1)
            key = series_key(key, self.parse_selector(key))
        self.keys.append(key)
        return Metric(key, name.pos)

    def parse_selector(self, metric: str) -> dict[str, str]:
        self.advance()  # '{'
        allowed: tuple[str, ...] = ()
        try:
            allowed = catalog.get(metric).labels
        except KeyError:
            pass  # a custom resolver's metric: no label check
        labels: dict[str, str] = {}
        while True:
            lt = self.tok
            if lt.kind != "ident":
                raise ExprError(f"expected a label name, found {self._describe(lt)}", lt.pos + 1)
            self.advance()
            if lt.text in SCOPE_LABELS:
                raise ExprError(f"label {lt.text!r} is set by the rule's scope, not in the expression",
                                lt.pos + 1)
            if allowed and lt.text not in allowed:
                raise ExprError(f"{metric} has no label {lt.text!r}", lt.pos + 1)
            self.expect("=", "'='")
            vt = self.tok
            if vt.kind != "str":
                raise ExprError(f'expected a quoted label value, found {self._describe(vt)}', vt.pos + 1)
            self.advance()
            labels[lt.text] = vt.text
            if self.at(","):
                self.advance()
                continue
            self.expect("}", "',' or '}'")
            return labels


def _with_pos(node: Node, pos: int) -> Node:
    # Dataclasses are frozen: rebuild only the position (cheap, done once at parse time).
    return replace(node, pos=pos)  # type: ignore[type-var]


@dataclass(frozen=True)
class Expr:
    """A compiled condition. ``keys``: the series keys it reads, in order of first use."""

    text: str
    root: BoolNode
    keys: tuple[str, ...]

    def evaluate(self, values: Values) -> bool:
        """True only when the condition definitely holds (unknown counts as not firing)."""
        return self.root.truth(values) is True

    def truth(self, values: Values) -> Tri:
        return self.root.truth(values)

    def snapshot(self, values: Values) -> dict[str, float | None]:
        """The values this condition read: the evidence attached to a firing."""
        return {k: values.get(k) for k in self.keys}

    @property
    def metrics(self) -> frozenset[str]:
        """Catalog metric names referenced (labels dropped)."""
        return frozenset(base_name(k) for k in self.keys)


def compile_expr(text: str, resolve: Resolver | None = None) -> Expr:
    """Parse and type-check a condition; raises ExprError with a 1-based column."""
    p = _Parser(text, resolve or default_resolve)
    root = p.parse()
    return Expr(text, root, tuple(dict.fromkeys(p.keys)))

