"""The bounds a target's strategy of cases declares, and the check of a case that did not come from it.

A target's sizes are declared as :class:`Split` (sharded over the implementation's group, drawn per
rank) or :class:`Free` (not sharded). ``shardfuzz.strategies.cases`` builds its strategy from them
and records what it draws on the strategy it returns, as a :class:`CaseBounds` (:func:`declare`):
the world sizes, the largest mesh rank, each size's spec, the value profiles and the option names.
:func:`bounds_of` reads them back from that strategy, from a ``one_of`` (``a | b``) of such
strategies (a case is in bounds when any branch admits it) and from a strategy declared like one
(``shardfuzz.strategies.bounded_like``). Any other strategy (``.map``, ``.filter``, ``@composite``,
``builds``, a branch of any of these) declares nothing, and its cases are not checked here.

:func:`check_in_bounds` holds a case from elsewhere (a failure file, a record of a store of
findings) to them before its inputs are built. It admits exactly the cases the strategy draws in
some run: at any world sizes a run may ask for (a target's ``cases(world_sizes=...)`` is asked for
the case's world size; a strategy given as it is, for its own), and on the 1-rank path (world 1
with the sizes drawn for the group of a larger world: ``shardfuzz.case.one_rank_path``). Not
bounds, since a run sets them: the dtype (a run's ``dtypes`` put any case in any dtype of
``shardfuzz.case.DTYPES``), option values (``--option``) and the seed.

Imports only the core, no Hypothesis: a strategy is a key here, and ``branches`` (what ``one_of``
draws from) the one attribute read from it.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from shardfuzz.case import PROFILE_PARAMS, Case, edge_problem
from shardfuzz.errors import InvalidArgument
from shardfuzz.limits import MAX_WORLD_SIZE, max_world_size

__all__ = [
    "PROFILE_PARAMS",
    "CaseBounds",
    "Free",
    "Split",
    "bounds_of",
    "branches_drawing",
    "check_in_bounds",
    "declare",
    "mesh_shapes_for",
]


def check_int(name: str, value: Any, minimum: int) -> None:
    """InvalidArgument unless ``value`` is an int (not a bool) >= ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgument(f"{name}={value!r}; must be an int >= {minimum}")


def check_range(lo_name: str, lo: int, hi_name: str, hi: int) -> None:
    """InvalidArgument when ``lo > hi``."""
    if lo > hi:
        raise InvalidArgument(f"{lo_name}={lo!r} > {hi_name}={hi!r}; no value can satisfy both bounds")


def mesh_shapes_for(world_size: int, *, max_dims: int = 2) -> list[tuple[int, ...]]:
    """Mesh shapes for a world size, simplest first: 1-D, then 2-D factorisations (size-1 axes
    included), then, up to ``max_dims``, meshes of 3 or more axes that all exceed 1 (a size-1 axis
    would make one a mesh of fewer axes in all but name; the first is (2, 2, 2) on 8 ranks)."""
    check_int("world_size", world_size, 1)
    check_int("max_dims", max_dims, 1)
    shapes: list[tuple[int, ...]] = [(world_size,)]
    if max_dims >= 2 and world_size > 1:
        two = [(a, world_size // a) for a in range(2, world_size) if world_size % a == 0]
        shapes += [*sorted(two, key=lambda s: (abs(s[0] - s[1]), s)), (1, world_size), (world_size, 1)]
    for dims in range(3, max_dims + 1):
        shapes += sorted(_factorisations(world_size, dims), key=lambda s: (max(s) - min(s), s))
    return shapes


def _factorisations(n: int, dims: int) -> list[tuple[int, ...]]:
    """Every ordered way to write ``n`` as a product of ``dims`` factors that all exceed 1."""
    if dims == 1:
        return [(n,)] if n > 1 else []
    return [(a, *rest) for a in range(2, n + 1) if n % a == 0 for rest in _factorisations(n // a, dims - 1)]


#: what a :class:`Split` size is drawn for: the group under test (mesh[-1]) or its replicas
SPLIT_OVER = ("group", "replicas")


@dataclasses.dataclass(frozen=True)
class Split:
    """A size sharded over the implementation's group: ``per_rank * group + remainder``.

    ``per_rank`` is drawn in ``[min_per_rank, max_per_rank]`` and the remainder in
    ``[0, group - 1]`` when ``uneven`` (else 0). Fewer rows than ranks need ``allow_empty``: it
    adds ``per_rank`` 0 to the draw, whatever ``min_per_rank`` is (the global size still stays
    >= 1), so "uneven" never shrinks into "empty" unless asked.
    DTensor's ``Shard`` rule (``ceil(n / g)`` rows a rank) leaves trailing shards empty for some
    larger sizes too (4 on 3 ranks: ``[2, 2, 0]``), whatever ``allow_empty`` says.
    ``min_size`` is the smallest global size, for a dim that is degenerate below it (a router over
    one expert has a softmax of one element: its gradient is exactly 0); a smaller draw is raised
    to it. ``over="replicas"``: drawn for the data-parallel axis instead, the ``world / group``
    replicas of a dp x tp mesh (1 on a 1-D mesh): a batch the target splits over dp itself (an
    ``AsDTensor`` input on ``mesh="all"``, say). Such a size is not in ``Case.split``, which names
    the sizes split over the group.
    """

    min_per_rank: int = 1
    max_per_rank: int = 3
    uneven: bool = True
    allow_empty: bool = False
    min_size: int = 1
    over: str = "group"

    def __post_init__(self) -> None:
        check_int("min_per_rank", self.min_per_rank, 0)
        check_int("max_per_rank", self.max_per_rank, 0)
        check_range("min_per_rank", self.min_per_rank, "max_per_rank", self.max_per_rank)
        if self.min_per_rank == 0 and not self.allow_empty:
            raise InvalidArgument("min_per_rank=0 gives empty shards; pass allow_empty=True to allow them")
        if self.max_per_rank == 0 and not self.uneven:
            raise InvalidArgument("max_per_rank=0 with uneven=False gives a global size of 0")
        check_int("min_size", self.min_size, 1)
        if self.over not in SPLIT_OVER:
            raise InvalidArgument(f"over={self.over!r}; allowed: {', '.join(SPLIT_OVER)}")

    def __repr__(self) -> str:  # ``over`` shown only where it is not the group (older messages)
        shown = [f for f in dataclasses.fields(self) if f.name != "over" or self.over != "group"]
        return f"Split({', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in shown)})"

    def parts(self, group: int, replicas: int) -> int:
        """How many ranks the size is drawn for: the group's, or the replicas' (``over``)."""
        return group if self.over == "group" else replicas

    def admits(self, size: int, group: int) -> bool:
        """Whether ``shardfuzz.strategies.sharded_sizes(group, self)`` can draw ``size``."""
        if size < self.min_size:
            return False
        smallest = 1 if self.allow_empty else self.min_per_rank * group
        if size == self.min_size and smallest <= size:  # a smaller draw raised to min_size
            return True
        if self.allow_empty and 1 <= size <= max(group - 1, 1):  # fewer rows than ranks
            return True
        per_rank, rest = divmod(size, group)
        return max(self.min_per_rank, 1) <= per_rank <= self.max_per_rank and (rest == 0 or self.uneven)

    def describe(self, group: int) -> str:
        """The sizes :meth:`admits` on ``group`` ranks, in words."""
        parts = []
        if self.allow_empty:
            parts.append("1" if group == 1 else f"1..{group - 1}")
        lo = max(self.min_per_rank, 1)
        if self.max_per_rank >= lo:
            if self.uneven or group == 1:
                hi = self.max_per_rank * group + (group - 1 if self.uneven else 0)
                parts.append(f"{lo * group}..{hi}")
            else:
                parts.append(f"the multiples of {group} in {lo * group}..{self.max_per_rank * group}")
        raised = f", a smaller one raised to {self.min_size}" if self.min_size > 1 else ""
        return " or ".join(parts) + raised


@dataclasses.dataclass(frozen=True)
class Free:
    """A size that is not sharded, in ``[min_size, max_size]``; shrinks toward ``min_size``."""

    min_size: int = 1
    max_size: int = 4

    def __post_init__(self) -> None:
        check_int("min_size", self.min_size, 0)
        check_int("max_size", self.max_size, 0)
        check_range("min_size", self.min_size, "max_size", self.max_size)

    def admits(self, size: int) -> bool:
        return self.min_size <= size <= self.max_size

    def describe(self) -> str:
        return f"{self.min_size}..{self.max_size}"


def _worlds_text(worlds: tuple[int, ...] | range) -> str:
    if isinstance(worlds, range):
        return f"{worlds.start}..{worlds.stop - 1}"
    return ", ".join(map(str, worlds))


@dataclasses.dataclass(frozen=True)
class CaseBounds:
    """What one strategy made by ``shardfuzz.strategies.cases`` draws (see the module docstring).

    ``worlds`` are the world sizes it draws; 1 among them also allows the 1-rank path. A case's
    mesh is one of :func:`mesh_shapes_for` its world size and ``max_dims``; each ``Split`` size is
    drawn for the group ``mesh[-1]``; its option names are ``options`` plus its profile's
    :data:`PROFILE_PARAMS`.
    """

    worlds: tuple[int, ...] | range
    max_dims: int
    sizes: tuple[tuple[str, Split | Free], ...]
    profiles: tuple[str, ...]
    options: frozenset[str]

    def option_names(self) -> frozenset[str]:
        """Every option name a case of it may have: its options and its profiles' parameters."""
        return self.options | {p for profile in self.profiles for p in PROFILE_PARAMS.get(profile, ())}

    def problem(self, case: Case) -> str | None:
        """Why the strategy never draws ``case`` on the ranks it has (None: it may)."""
        if (why := self.names_problem(case)) is not None:
            return why
        if case.world_size not in self.worlds:
            return f"world_size={case.world_size}; it draws world sizes {_worlds_text(self.worlds)}"
        meshes = mesh_shapes_for(case.world_size, max_dims=self.max_dims)
        if case.mesh not in meshes:
            shown = ", ".join(map(str, meshes))
            return (
                f"mesh={case.mesh} on world size {case.world_size}; it draws the meshes {shown} "
                f"(at most {self.max_dims}-D)"
            )
        return self.values_problem(case, case.mesh[-1], case.world_size // case.mesh[-1])

    def names_problem(self, case: Case) -> str | None:
        """Why the case's profile, size names, split names and option names are not ones it draws
        (None: they are)."""
        if case.profile not in self.profiles:
            return f"profile={case.profile!r}; it draws {', '.join(self.profiles)}"
        if (why := _names("sizes", case.sizes, {n for n, _ in self.sizes})) is not None:
            return why
        split = sorted(n for n, spec in self.sizes if isinstance(spec, Split) and spec.over == "group")
        if sorted(case.split) != split:
            return f"split={case.split}; it splits {split}"
        drawn = self.options | set(PROFILE_PARAMS[case.profile])
        why = _names("options", case.options, drawn, f" with profile {case.profile!r}")
        return why if why is not None or case.profile != "edge" else edge_problem(case.options)

    def values_problem(self, case: Case, group: int, replicas: int = 1) -> str | None:
        """Why the case's sizes are not drawn for a group of ``group`` ranks and ``replicas`` of it
        (None: they may be); its names are those drawn."""
        for name, spec in self.sizes:
            size = case.sizes[name]
            if isinstance(spec, Free) and not spec.admits(size):
                return f"sizes[{name!r}]={size}; it draws {spec.describe()} ({spec})"
            if isinstance(spec, Split) and not spec.admits(size, spec.parts(group, replicas)):
                parts = spec.parts(group, replicas)
                over = (
                    f"a group of {group} rank(s) (mesh[-1])"
                    if spec.over == "group"
                    else f"{replicas} replica(s)"
                )
                return f"sizes[{name!r}]={size}; split over {over} it draws {spec.describe(parts)} ({spec})"
        return None

    def one_rank_groups(self, world: int) -> list[int]:
        """The groups whose sizes the 1-rank path may keep when it puts a case of ``world`` ranks
        on 1 rank (none unless the strategy draws both 1 and ``world``)."""
        if world < 2 or 1 not in self.worlds or world not in self.worlds:
            return []
        return sorted({m[-1] for m in mesh_shapes_for(world, max_dims=self.max_dims)})


def _names(
    field: str, given: Mapping[str, Any], drawn: set[str] | frozenset[str], when: str = ""
) -> str | None:
    missing, unknown = sorted(set(drawn) - set(given)), sorted(set(given) - set(drawn))
    if not missing and not unknown:
        return None
    wrong = [f"lacks {missing}"] if missing else []
    wrong += [f"has {unknown}, which it does not draw"] if unknown else []
    return f"{field} {' and '.join(wrong)}{when}; it draws {sorted(drawn)}"


_DECLARED: weakref.WeakKeyDictionary[Any, tuple[CaseBounds, ...]] = weakref.WeakKeyDictionary()


def declare(strategy: Any, bounds: Sequence[CaseBounds] | None) -> Any:
    """Record that every case ``strategy`` draws lies within one of ``bounds`` (None or empty:
    nothing is declared); returns ``strategy``."""
    if bounds:
        _DECLARED[strategy] = tuple(bounds)
    return strategy


def bounds_of(strategy: Any) -> tuple[CaseBounds, ...] | None:
    """The bounds ``strategy`` declares: its own, else those of every branch of a ``one_of``
    together; None when it, or any branch, declares none."""
    try:
        own = _DECLARED.get(strategy)
    except TypeError:  # not a strategy (it cannot be weakly referenced)
        return None
    if own is not None:
        return own
    branches = list(getattr(strategy, "branches", None) or ())
    if len(branches) < 2 or any(b is strategy for b in branches):
        return None
    found: list[CaseBounds] = []
    for branch in branches:
        got = bounds_of(branch)
        if got is None:
            return None
        found += got
    return tuple(found)


def branches_drawing(strategy: Any, names: frozenset[str]) -> tuple[list[Any], list[frozenset[str]]] | None:
    """For options pinned by name: the branches of ``strategy`` (itself, or the leaves of its
    ``one_of``, recursively) whose cases may carry every option in ``names`` (a value profile's
    parameters count), and the option names of every branch (for an error that lists them); None
    when it, or a branch, declares no bounds
    (its cases' options are known only once drawn)."""
    try:
        own = _DECLARED.get(strategy)
    except TypeError:  # not a strategy (it cannot be weakly referenced)
        return None
    if own is not None:
        drawn = [b.options.union(*(PROFILE_PARAMS.get(p, ()) for p in b.profiles)) for b in own]
        return ([strategy] if any(names <= o for o in drawn) else []), drawn
    branches = list(getattr(strategy, "branches", None) or ())
    if len(branches) < 2 or any(b is strategy for b in branches):
        return None
    chosen: list[Any] = []
    every: list[frozenset[str]] = []
    for branch in branches:
        got = branches_drawing(branch, names)
        if got is None:
            return None
        chosen += got[0]
        every += got[1]
    return chosen, every


def _asked(target: Any, world_sizes: tuple[int, ...]) -> tuple[CaseBounds, ...] | str | None:
    """The bounds of ``target``'s strategy for a run at ``world_sizes``, or the target's refusal
    of those world sizes (a str)."""
    try:
        return target.case_bounds(world_sizes)
    except InvalidArgument as e:  # TargetError too
        return f"its cases(world_sizes={world_sizes}) refuses them: {e}"


def check_in_bounds(target: Any, case: Case) -> None:
    """InvalidArgument, naming the field, its value and what the target draws, when no run of
    ``target`` can draw ``case`` (see the module docstring); nothing when its strategy declares
    no bounds. The 1-rank path's group is looked for up to the largest world size allowed
    (``$SHARDFUZZ_MAX_WORLD``, at least 16)."""
    own = _asked(target, (case.world_size,))
    if own is None:
        return
    if case.world_size == 1 and _drawn_on_1_rank(target, case):
        return
    if isinstance(own, str):
        why = own
    else:
        problems = [b.problem(case) for b in own]
        if None in problems:
            return
        # the branches whose names the case has say what is wrong; else every branch
        named = [p for b, p in zip(own, problems) if b.names_problem(case) is None] or problems
        named = list(dict.fromkeys(named))  # a problem every branch has, once
        why = str(named[0])
        if len(named) > 1:
            why = "no branch of its strategy draws it: " + "; ".join(
                f"branch {i + 1}: {p}" for i, p in enumerate(named)
            )
        if case.world_size == 1:
            why += "; nor is it the 1-rank case of a larger world (which keeps the sizes drawn for its group)"
    raise InvalidArgument(f"target {target.name!r} never draws this case: {why}")


def _drawn_on_1_rank(target: Any, case: Case) -> bool:
    """Whether a run at world sizes (1, W), for some W >= 2, may draw the 1-rank ``case``: on 1
    rank, or on the 1-rank path with the sizes drawn for the group of W ranks."""
    if case.mesh != (1,):
        return False
    for world in range(2, max(MAX_WORLD_SIZE, max_world_size()) + 1):
        got = _asked(target, (1, world))
        for b in got if isinstance(got, tuple) else ():
            groups = [1, *b.one_rank_groups(world)] if 1 in b.worlds else []
            # on the 1-rank path the replicas were world // group (or 1: a genuine 1-rank case)
            if b.names_problem(case) is None and any(
                b.values_problem(case, g, r) is None for g in groups for r in {1, world // g}
            ):
                return True
    return False
