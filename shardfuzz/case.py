"""The Case: one concrete example, as plain data.

A case is frozen, picklable and JSON-able, and ``repr(case)`` is a single line that rebuilds it,
so the "Falsifying example" line Hypothesis prints can be pasted into ``shardfuzz case``.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import copy
import dataclasses
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from shardfuzz.errors import InvalidArgument

DTYPES = ("float32", "float64", "bfloat16", "float16")
#: value profiles, simplest first (the one list: ``shardfuzz.strategies`` draws from it). "large"
#: scales values by 10**k, "small" scales them down, "ties" quantises them to a coarse grid, "edge"
#: writes one value at the edge of the dtype into every last-dim row (:data:`EDGE_KINDS`).
VALUE_PROFILES = ("normal", "large", "small", "ties", "edge")
#: what the ``edge`` profile writes (``shardfuzz.spec.inputs.edge_value``), simplest first:
#: ``max``: the largest finite value of the next narrower dtype (float16's 65504 for float32 and
#: bfloat16 data, float32's for float64, float8 e4m3's 448 for float16) scaled by 2**-k: a cast to
#: that narrower wire or accumulator overflows, while the case dtype keeps headroom for any order
#: of a correct computation (its own largest value has none); in a softmax's input (role
#: ``scores``) it is a finite mask instead, minus float16's 65504 (448 in float16 data) scaled by
#: 2**-k; ``subnormal``: the case dtype's smallest normal value scaled by 2**-(k+1);
#: ``signed_zero``: -0.0; ``repeat``: the value beside it again (an exact tie)
EDGE_KINDS = ("max", "subnormal", "signed_zero", "repeat")
#: how many slots ``edge_slot`` names: it is drawn in ``[0, EDGE_SLOTS)`` and taken modulo the row
EDGE_SLOTS = 8
#: how far below its limit an edge value is drawn: ``edge_exp`` in ``[0, EDGE_EXPONENTS)``
EDGE_EXPONENTS = 8


#: the option names each value profile adds to a case (``shardfuzz.strategies.value_profiles``)
PROFILE_PARAMS: dict[str, tuple[str, ...]] = {
    "normal": (),
    "large": ("scale",),
    "small": ("scale",),
    "ties": ("grid",),
    "edge": ("edge", "edge_exp", "edge_slot"),
}


#: every option name a value profile adds
PROFILE_PARAM_NAMES = frozenset(p for params in PROFILE_PARAMS.values() for p in params)


def edge_problem(options: Mapping[str, Any]) -> str | None:
    """Why an ``edge`` case's kind, exponent or slot is not one ``shardfuzz.strategies`` draws
    (None: they are)."""
    kind = options.get("edge")
    if kind not in EDGE_KINDS:
        return f"options['edge']={kind!r}; it draws {', '.join(EDGE_KINDS)}"
    for name, count in (("edge_exp", EDGE_EXPONENTS), ("edge_slot", EDGE_SLOTS)):
        v = options.get(name)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < count:
            return f"options[{name!r}]={v!r}; it draws an int in [0, {count - 1}]"
    return None


#: on inside :func:`one_rank_path` (read by ``shardfuzz.strategies.cases``)
ONE_RANK_PATH: contextvars.ContextVar[bool] = contextvars.ContextVar("shardfuzz_one_rank_path", default=False)


@contextlib.contextmanager
def one_rank_path() -> Iterator[None]:
    """Within this block, ``shardfuzz.strategies.cases`` on 2+ ranks (where 1 rank is allowed)
    draws one more choice, last: 0 runs the case on 1 rank with the sizes drawn for the group
    (:func:`shardfuzz.engine.finish.try_one_rank`; see the strategies' module docstring)."""
    token = ONE_RANK_PATH.set(True)
    try:
        yield
    finally:
        ONE_RANK_PATH.reset(token)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class Case:
    """One example.

    Attributes:
        target: the target's name.
        world_size: number of ranks (processes).
        mesh: the device-mesh shape; its product is ``world_size``. The implementation runs on the
            *last* axis; the other axes hold independent replicas (e.g. ``(2, 2)`` is dp x tp).
            Size-1 axes are allowed.
        sizes: named global sizes, e.g. ``{"hidden": 5}``.
        split: the names of the sizes that are sharded over the implementation's axis.
        dtype: dtype name (a string until it reaches a worker).
        profile: value-profile name, one of :data:`VALUE_PROFILES`.
        seed: seed of the ``torch.Generator`` that builds the inputs.
        options: target options (``causal``, ``top_k``, ``steps``, value-profile parameters, ...).
    """

    target: str
    world_size: int
    mesh: tuple[int, ...]
    sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    split: tuple[str, ...] = ()
    dtype: str = "float32"
    profile: str = "normal"
    seed: int = 0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or not self.target:
            raise InvalidArgument(f"target={self.target!r}; must be the target's name (a non-empty string)")
        if not _is_int(self.world_size) or self.world_size < 1:
            raise InvalidArgument(f"world_size={self.world_size!r}; must be an int >= 1")
        self._check_mesh()
        if self.dtype not in DTYPES:
            raise InvalidArgument(f"dtype={self.dtype!r}; allowed: {', '.join(DTYPES)}")
        self._check_sizes_and_split()
        if self.profile not in VALUE_PROFILES:
            raise InvalidArgument(f"profile={self.profile!r}; allowed: {', '.join(VALUE_PROFILES)}")
        if not _is_int(self.seed) or not 0 <= self.seed < 2**64:
            raise InvalidArgument(f"seed={self.seed!r}; must be an int in [0, 2**64)")
        if not isinstance(self.options, Mapping) or not all(isinstance(k, str) for k in self.options):
            raise InvalidArgument(
                f"options={self.options!r}; must be a dict of option name -> value, e.g. {{'causal': True}}"
            )
        object.__setattr__(self, "options", dict(self.options))

    def _check_mesh(self) -> None:
        """The mesh: a non-empty tuple of ints >= 1 whose product is the world size."""
        if not isinstance(self.mesh, (tuple, list)):
            raise InvalidArgument(
                f"mesh={self.mesh!r}; must be a non-empty tuple of ints >= 1, e.g. ({self.world_size},)"
            )
        mesh = tuple(self.mesh)
        object.__setattr__(self, "mesh", mesh)
        if not mesh or any(not _is_int(m) or m < 1 for m in mesh):
            raise InvalidArgument(f"mesh={self.mesh!r}; must be a non-empty tuple of ints >= 1")
        if math.prod(mesh) != self.world_size:
            raise InvalidArgument(
                f"mesh={mesh!r} has {math.prod(mesh)} ranks but world_size={self.world_size!r}"
            )

    def _check_sizes_and_split(self) -> None:
        """Sizes: size name -> int >= 0; split: a tuple of names among the sizes."""
        if not isinstance(self.sizes, Mapping):
            raise InvalidArgument(
                f"sizes={self.sizes!r}; must be a dict of size name -> int >= 0, e.g. {{'hidden': 5}}"
            )
        for name, value in dict(self.sizes).items():
            if not isinstance(name, str):
                raise InvalidArgument(f"sizes has the key {name!r}; size names must be strings")
            if not _is_int(value) or value < 0:
                raise InvalidArgument(f"sizes[{name!r}]={value!r}; must be an int >= 0")
        object.__setattr__(self, "sizes", dict(self.sizes))
        if isinstance(self.split, str) or not isinstance(self.split, (tuple, list)):
            raise InvalidArgument(f"split={self.split!r}; must be a tuple of size names, e.g. ('hidden',)")
        object.__setattr__(self, "split", tuple(self.split))
        for name in self.split:
            if name not in self.sizes:
                raise InvalidArgument(
                    f"split={self.split!r} names {name!r}, which is not in sizes={self.sizes!r}"
                )

    # -- derived ---------------------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """Size of the mesh axis the implementation runs on (the last one)."""
        return self.mesh[-1]

    @property
    def replicas(self) -> int:
        """Number of independent replicas of the implementation (product of the other axes)."""
        return self.world_size // self.group_size

    @property
    def replica_ranks(self) -> list[list[int]]:
        """The global ranks of each replica's group (one list per replica)."""
        g = self.group_size
        return [list(range(i * g, (i + 1) * g)) for i in range(self.replicas)]

    def rank_label(self, rank: int) -> str:
        """``rank 3``, or ``rank 3 (replica 1, group rank 1)`` on a mesh of several axes."""
        if len(self.mesh) == 1:
            return f"rank {rank}"
        g = self.group_size
        return f"rank {rank} (replica {rank // g}, group rank {rank % g})"

    def __hash__(self) -> int:
        # sizes and options are dicts: hashed by their JSON text, as to_json_str() writes them but
        # without dataclasses.asdict's deep copy (every drawn case is hashed: pools, dedup, stats)

        try:
            parts = json.dumps([self.sizes, self.options], sort_keys=True)
        except TypeError:  # an option value JSON cannot write as it is (a dataclass): asdict can
            return hash(self.to_json_str())
        return hash(
            (self.target, self.world_size, self.mesh, self.split, self.dtype, self.profile, self.seed, parts)
        )

    # -- serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["mesh"] = list(self.mesh)
        d["split"] = list(self.split)
        return d

    def to_json_str(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Case:
        """A case from its :meth:`to_dict` form; every field is validated (InvalidArgument names it)."""
        if not isinstance(d, Mapping):
            raise InvalidArgument(f"case={d!r}; must be an object of Case fields")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - fields
        if unknown:
            raise InvalidArgument(f"case has unknown field(s) {sorted(unknown)}; allowed: {sorted(fields)}")
        missing = {"target", "world_size", "mesh"} - set(d)
        if missing:
            raise InvalidArgument(f"case is missing field(s) {sorted(missing)}")
        return cls(**dict(d))

    @classmethod
    def parse(cls, text: str) -> Case:
        """Rebuild a case from its ``repr`` (``Case(target=..., ...)``) without ``eval``."""
        try:
            node = ast.parse(text.strip(), mode="eval").body
        except SyntaxError as e:
            raise InvalidArgument(f"case={text!r} is not a Case(...) expression: {e}") from None
        if not (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "Case"
            and not node.args
            and all(k.arg is not None for k in node.keywords)  # no **mapping
        ):
            raise InvalidArgument(
                f"case={text!r}; expected Case(target=..., world_size=..., ...) with keywords"
            )
        try:
            kw = {k.arg: read_literal(k.value) for k in node.keywords if k.arg is not None}
        except ValueError as e:
            raise InvalidArgument(f"case={text!r} holds a non-literal value: {e}") from None
        return cls.from_dict(kw)


#: the names ``repr`` writes a non-finite float as (``float('inf')`` is ``inf``)
FLOAT_NAMES = {"inf": math.inf, "nan": math.nan}


class _FloatNames(ast.NodeTransformer):
    """``inf`` and ``nan`` as the float constants they name."""

    def visit_Name(self, name: ast.Name) -> ast.AST:
        if name.id in FLOAT_NAMES:
            return ast.copy_location(ast.Constant(FLOAT_NAMES[name.id]), name)
        return name


def read_literal(node: ast.AST | str) -> Any:
    """``ast.literal_eval`` that also reads ``inf`` and ``nan`` as ``repr`` writes them: the rerun
    line of a case with an option ``norm_type=inf`` was refused as "malformed node"."""
    tree = ast.parse(node.strip(), mode="eval").body if isinstance(node, str) else node
    return ast.literal_eval(_FloatNames().visit(copy.deepcopy(tree)))  # a copy: the caller's stays


def pin_options(
    target: str, pinned: dict[str, Any], case: Case, profiles: Sequence[str] | None = None
) -> Case:
    """``case`` with the ``pinned`` options (``RunConfig.options``); an unknown name is an error,
    and so is a value of another kind than the one drawn (a string for a number: ``steps="2"``
    reached the target's ``inputs()`` and crashed there, as if the target were at fault). A value
    profile's parameter (``scale``, ``grid``, ``edge``...) puts the case in that profile first
    (:func:`in_profile_of`; ``profiles``: those the target draws, None when it declares none)."""
    case = in_profile_of(target, pinned, case, profiles)
    unknown = sorted(set(pinned) - set(case.options))
    if unknown:
        own = sorted(set(case.options) - PROFILE_PARAM_NAMES)
        raise InvalidArgument(
            f"option {unknown[0]!r} pinned, but target {target!r} has no such option; "
            f"its options: {', '.join(own) or 'none'}"
        )
    # a non-finite float given as a word (--option norm_type=inf) where the target draws a float
    pinned = {name: _float_word(value, case.options[name]) for name, value in pinned.items()}
    for name, value in pinned.items():
        problem = option_kind_problem(target, name, value, [case.options[name]])
        if problem:
            raise InvalidArgument(f"option {name!r}={value!r} pinned, but {problem}")
    options = {**case.options, **pinned}
    problem = profile_param_problem(case.profile, options) if set(pinned) & PROFILE_PARAM_NAMES else None
    if problem:
        raise InvalidArgument(f"{problem} (pinned: {', '.join(f'{k}={v!r}' for k, v in pinned.items())})")
    return dataclasses.replace(case, options=options)


def _float_word(value: Any, drawn: Any) -> Any:
    """``value``, or the float it names where it is ``inf``, ``-inf`` or ``nan`` and the target
    draws a float there (a target that draws the word itself, dtensor_ops' ``ord``, keeps it)."""
    if (
        isinstance(value, str)
        and isinstance(drawn, float)
        and value.strip().lower() in ("inf", "+inf", "-inf", "nan")
    ):
        return float(value)
    return value


def profile_param_problem(profile: str, options: Mapping[str, Any]) -> str | None:
    """Why a case's value-profile parameters are not ones that profile can use (None: they can):
    a pinned one, or a hand-made case's."""
    if profile == "edge":
        return edge_problem(options)
    for name in PROFILE_PARAMS.get(profile, ()):
        v = options.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
            return f"options[{name!r}]={v!r}; the {profile!r} value profile takes a finite number > 0"
    return None


#: the range of a pinned value profile's number: what the profiles draw (a scale of 10..1e4 or
#: 1e-4..0.1, a grid of 0.25..1) and a margin, within which every dtype keeps the values finite
#: and distinct (a grid of 1e-300 made every input NaN, a scale of 1e39 every one inf)
PINNED_RANGES = {"scale": (1e-6, 1e6), "grid": (2.0**-8, 2.0**8)}


def in_profile_of(
    target: str, pinned: Mapping[str, Any], case: Case, profiles: Sequence[str] | None = None
) -> Case:
    """``case`` in the value profile whose parameters are pinned (``grid`` -> ``ties``, ``edge``
    -> ``edge``, ``scale`` -> ``large``, or ``small`` for a scale below 1), its own profile's
    parameters replaced; unchanged when none is pinned or it is in that profile already. Like
    ``dtypes``, a map that draws nothing: a parameter not pinned (an edge's exponent) is picked by
    the case's seed. A profile the target does not draw (``profiles``) is an error."""
    names = set(pinned) & PROFILE_PARAM_NAMES
    if not names:
        return case
    having = [p for p, params in PROFILE_PARAMS.items() if names <= set(params)]
    if not having:
        sets = "; ".join(f"{p}: {', '.join(params)}" for p, params in PROFILE_PARAMS.items() if params)
        raise InvalidArgument(
            f"options {', '.join(sorted(names))} pinned together, but no value profile has them all ({sets})"
        )
    for name in names & set(PINNED_RANGES):  # checked first: a scale of 0 is no profile's
        v, (lo, hi) = pinned[name], PINNED_RANGES[name]
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not lo <= v <= hi:
            raise InvalidArgument(
                f"option {name!r}={v!r} pinned; a value profile's {name} is a number in [{lo:g}, {hi:g}]"
                + (" (above 1: large values, below: small ones)" if name == "scale" else "")
            )
    scale = pinned.get("scale")
    if "scale" in names:  # the profile's name says which way: a scale below 1 shrinks the values
        profile = "small" if isinstance(scale, (int, float)) and scale < 1 else "large"
    else:
        profile = case.profile if case.profile in having else having[0]
    if case.profile == profile:
        return case
    if profiles is not None and profile not in profiles:
        shown = ", ".join(f"{k}={v!r}" for k, v in pinned.items() if k in names)
        raise InvalidArgument(
            f"{shown} pinned: a parameter of the {profile!r} value profile, which target {target!r} "
            f"does not draw; it draws {', '.join(profiles)}"
        )
    seed = case.seed
    drawn = {  # what the profile would carry; the pinned values replace them next
        "scale": 10.0 if profile == "large" else 0.1,
        "grid": 0.5,
        "edge": EDGE_KINDS[seed % len(EDGE_KINDS)],
        "edge_exp": seed // len(EDGE_KINDS) % EDGE_EXPONENTS,
        "edge_slot": seed // (len(EDGE_KINDS) * EDGE_EXPONENTS) % EDGE_SLOTS,
    }
    options = {k: v for k, v in case.options.items() if k not in PROFILE_PARAM_NAMES}
    options.update({p: drawn[p] for p in PROFILE_PARAMS[profile]})
    return dataclasses.replace(case, profile=profile, options=options)


def option_kind_problem(target: str, name: str, value: Any, drawn: Sequence[Any]) -> str | None:
    """Why ``value`` cannot be option ``name`` of ``target``, whose strategy drew ``drawn`` for it:
    a value of another kind than every drawn one (a string for a number); None when it can."""
    kinds = {k: v for v in drawn if (k := _kind(v)) is not None}
    if value is None or not kinds or any(_kind(value) in _TAKES[k] for k in kinds):
        return None
    kind, example = next(iter(kinds.items()))
    # a number typed for a string option: the shell eats bare quotes (ord="2" is ord=2), so say
    # the quoting that keeps them (a DTensor maintainer tried both)
    quoted = f""" (on the command line: --option "{name}='{value}'")""" if kind == "string" else ""
    return f"target {target!r} draws {name} as {_A[kind]} (e.g. {example!r}); give {_A[kind]}{quoted}"


#: the kinds of pinned value each kind of drawn option value takes (None is taken by any: an
#: option may be optional; a drawn None says nothing)
_TAKES = {"bool": ("bool",), "int": ("int",), "float": ("float", "int"), "string": ("string",)}
_A = {"bool": "a bool", "int": "an int", "float": "a float", "string": "a string"}


def _kind(value: Any) -> str | None:
    """A JSON-like value's kind, for :func:`pin_options`; None for anything else."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return None
