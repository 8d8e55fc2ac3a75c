"""Known failures set aside: case predicates from ``--exclude EXPR`` (CLI), ``--shardfuzz-exclude
EXPR`` (pytest) and ``Target(known_failures=...)``, so a campaign can search past a bug it already
knows. An excluded case is counted by reason and shown in progress lines and summaries, never
passed silently.

An expression is a Python expression over the case's fields, e.g. ``options['smoothing'] > 0`` or
``world_size >= 3 and dtype == 'bfloat16'``, or over the trigger conditions the case reaches for its
target, ``'empty DTensor shard' in triggers``. It is parsed once and may use only names, constants,
subscripts, attribute reads of those names, comparisons, boolean and arithmetic operators, and a few
pure builtins (no calls of anything else, no imports, no assignments).
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from shardfuzz.case import Case
from shardfuzz.errors import InvalidArgument, TargetCodeError, Unsupported
from shardfuzz.spec.triggers import triggers_of

#: the names an expression may use: the case's fields, the case itself, and pure builtins
CASE_NAMES = (
    "case",
    "world_size",
    "mesh",
    "sizes",
    "split",
    "dtype",
    "profile",
    "seed",
    "options",
    "group_size",
)
#: the trigger conditions the case reaches for its target (``"'empty DTensor shard' in triggers"``):
#: the names its progress lines and reports print (:func:`shardfuzz.spec.triggers.conditions_met`)
TRIGGERS = "triggers"
#: the functions an expression may call
CALLS: dict[str, Any] = {
    "len": len, "min": min, "max": max, "abs": abs, "sum": sum, "any": any, "all": all,
}  # fmt: skip
BUILTINS: dict[str, Any] = {
    **CALLS,
    "True": True, "False": False, "None": None,
    "inf": math.inf, "nan": math.nan,  # as a case's repr writes them (options['norm_type'] == inf)
}  # fmt: skip
_NODES = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
    ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
    ast.Compare, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot,
    ast.Name, ast.Load, ast.Constant, ast.Subscript, ast.Attribute, ast.Tuple, ast.List, ast.Call,
    ast.IfExp, ast.Slice,
)  # fmt: skip


#: the case's fields that are mappings: read by key, never by attribute
_MAPS = ("sizes", "options")


class Excluded(Unsupported):
    """A case set aside as a known failure (counted in ``stats.excluded``, not as unsupported)."""


@dataclasses.dataclass(frozen=True)
class CaseExpression:
    """A validated ``--exclude`` expression; call it with a case."""

    text: str
    what: str = "--exclude"
    #: the keys it reads by name from ``sizes`` and ``options`` (``sizes['heads']``), set when made
    keys_read: dict[str, frozenset[str]] = dataclasses.field(init=False, repr=False, compare=False)
    #: the trigger names it tests by name (``'uneven' in triggers``), and whether it reads them at all
    triggers_read: frozenset[str] = dataclasses.field(init=False, repr=False, compare=False)
    reads_triggers: bool = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            tree = ast.parse(self.text.strip(), mode="eval")
        except SyntaxError as e:
            raise InvalidArgument(f"{self.what}={self.text!r} is not a Python expression: {e.msg}") from None
        allowed = set(CASE_NAMES) | {TRIGGERS} | set(BUILTINS)
        for node in ast.walk(tree):
            if not isinstance(node, _NODES):
                raise InvalidArgument(
                    f"{self.what}={self.text!r}: {type(node).__name__} is not allowed; use comparisons of "
                    f"the case's fields ({', '.join(CASE_NAMES)}), e.g. \"options['smoothing'] > 0\""
                )
            if isinstance(node, ast.Name) and node.id not in allowed:
                raise InvalidArgument(
                    f"{self.what}={self.text!r}: unknown name {node.id!r}; allowed: "
                    f"{', '.join((*CASE_NAMES, TRIGGERS))}"
                )
            if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in CALLS):
                raise InvalidArgument(
                    f"{self.what}={self.text!r}: only {', '.join(sorted(CALLS))} may be called"
                )
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Pow)
                and not (
                    isinstance(node.right, ast.Constant)
                    and isinstance(node.right.value, int)
                    and 0 <= node.right.value <= 64
                )
            ):  # 9**9**9 would compute for minutes before the first case
                raise InvalidArgument(
                    f"{self.what}={self.text!r}: ** takes a constant exponent from 0 to 64 here"
                )
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                raise InvalidArgument(f"{self.what}={self.text!r}: attribute {node.attr!r} is not allowed")
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in _MAPS
            ):
                # a mapping has no such attribute: every case read as "not excluded", silently
                raise InvalidArgument(
                    f"{self.what}={self.text!r}: {node.value.id} is a mapping; write "
                    f"{node.value.id}[{node.attr!r}], not {node.value.id}.{node.attr}"
                )
        object.__setattr__(self, "_code", compile(tree, f"<{self.what}>", "eval"))
        keys: dict[str, frozenset[str]] = {}
        for m in _MAPS:  # the keys it reads by name (sizes['heads'], case.sizes['heads']): checked
            keys[m] = frozenset(  # against a target
                node.slice.value
                for node in ast.walk(tree)
                if isinstance(node, ast.Subscript)
                and _names_map(node.value, m)
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            )
        object.__setattr__(self, "keys_read", keys)
        # the trigger names it tests ('uneven' in triggers): checked against a target, as keys are
        object.__setattr__(self, "triggers_read", frozenset(_triggers_named(tree)))
        object.__setattr__(self, "reads_triggers", any(_names_triggers(n) for n in ast.walk(tree)))

    def __call__(self, case: Case, target: Any = None) -> bool:
        return self.evaluate(case, target)[0]

    def evaluate(self, case: Case, target: Any = None) -> tuple[bool, str | None]:
        """Whether ``case`` is excluded, and the key it lacked when that is why not (an option of
        another branch, or a misspelling: the summary tells them apart by whether any case had it).
        ``target``: the case's, for an expression that reads ``triggers``."""
        names: dict[str, Any] = {n: getattr(case, n) for n in CASE_NAMES if n != "case"}
        names["case"] = case
        if self.reads_triggers:
            if target is None:
                raise InvalidArgument(
                    f"{self.what}={self.text!r} reads triggers, which need the case's target"
                )
            names[TRIGGERS] = frozenset(triggers_of(target, case))
        try:
            return bool(eval(self._code, {"__builtins__": BUILTINS}, names)), None  # type: ignore[attr-defined]
        except KeyError as e:
            return False, repr(e.args[0]) if e.args else "?"
        except (IndexError, TypeError, AttributeError):
            return False, None  # e.g. a size this case's strategy draws no tuple for: not excluded
        except (ArithmeticError, ValueError) as e:  # 1/0, int('x'): the expression is wrong, not the case
            raise InvalidArgument(
                f"{self.what}={self.text!r} raised {type(e).__name__}: {e}, on {case!r}"
            ) from None


def _names_triggers(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == TRIGGERS


def _triggers_named(tree: ast.AST) -> set[str]:
    """The string constants an expression tests for membership in ``triggers`` (``'x' in triggers``,
    ``'x' not in triggers``)."""
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, operands, operands[1:]):
            if isinstance(op, (ast.In, ast.NotIn)) and _names_triggers(right):
                if isinstance(left, ast.Constant) and isinstance(left.value, str):
                    out.add(left.value)
    return out


def _names_map(node: ast.AST, name: str) -> bool:
    """Whether ``node`` reads the case's mapping ``name``: ``sizes``, or ``case.sizes``."""
    if isinstance(node, ast.Attribute):
        return node.attr == name and isinstance(node.value, ast.Name) and node.value.id == "case"
    return isinstance(node, ast.Name) and node.id == name


def known_failures(spec: Any, target: str) -> tuple[tuple[str, Callable[[Case], bool]], ...]:
    """``Target(known_failures=...)`` as (reason, predicate) pairs: a mapping reason -> predicate or
    expression string, or a sequence of predicates / expression strings."""
    if not spec:
        return ()
    items = spec.items() if isinstance(spec, Mapping) else ((None, p) for p in spec)
    out = []
    for reason, pred in items:
        if isinstance(pred, str):
            pred = CaseExpression(pred, f"Target {target!r}: known_failures")
        if not callable(pred):
            raise InvalidArgument(
                f"Target {target!r}: known_failures entry {pred!r} is neither a predicate of the case "
                "nor an expression string"
            )
        label = reason or (
            pred.text if isinstance(pred, CaseExpression) else getattr(pred, "__name__", repr(pred))
        )
        out.append((str(label), pred))
    return tuple(out)


def exclusion(
    case: Case, target: Any, expressions: tuple[str, ...], lacked: collections.Counter | None = None
) -> str | None:
    """The reason ``case`` is set aside (a known failure of the target or an expression of the run),
    or None. ``lacked`` counts, per (expression, key), the cases an expression left in because
    they lacked a key it reads, and per (expression, None) those it read whole."""
    for reason, pred in target.known_failures:
        try:
            hit = pred(case, target) if isinstance(pred, CaseExpression) else pred(case)
        except Exception as e:
            raise TargetCodeError.of(target.name, f"known_failures[{reason!r}](case)", case, e) from e
        if hit:
            return reason
    for text in expressions:
        hit, key = _expression(text).evaluate(case, target)
        if hit:
            return text
        if lacked is not None:
            lacked[(text, key)] += 1
    return None


@functools.lru_cache(maxsize=256)
def _expression(text: str) -> CaseExpression:
    return CaseExpression(text)
