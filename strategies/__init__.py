"""Hypothesis strategies for shardfuzz cases (installed as ``shardfuzz.strategies``).

Every strategy takes keyword-only ``min_*``/``max_*`` bounds, raises
:class:`~shardfuzz.InvalidArgument` for bounds that cannot be met, and documents what it shrinks
toward (``tests/test_strategies.py`` pins each minimal example).

Draw order in :func:`cases` (it decides what shrinking can simplify first): target options, world
size and mesh, per-rank sizes and remainders, dtype, value profile, late options (steps, ...), and
the seed last. The world size is never derived from the divisors of a size: sizes are built from
the drawn world by construction (``per_rank * group + remainder``).

The path to 1 rank: lowering the world size shrinks a size drawn per rank with it (a dim of 3 drawn
as ``1 * 2 + 1`` on 2 ranks is 1 on 1 rank), so Hypothesis' shrinker alone cannot show that a
failure needs no communication. Inside :func:`one_rank_path` (used by ``shardfuzz.engine.finish`` after a
finding on 2+ ranks), :func:`cases` draws one more choice, last: 0 runs the case on 1 rank with the
global sizes drawn for the group. Hypothesis replays the finding's choices with that 0 appended
and shrinks from there when it fails. Outside it nothing more is drawn, so searches, covering rows
and the derandomized examples are those of a strategy without it.

Bounds: the strategy :func:`cases` returns declares what it draws (a
:class:`~shardfuzz.spec.bounds.CaseBounds`: world sizes, mesh rank, each size's ``Split``/``Free``,
profiles, option names; :func:`bounds_of` reads it, from a ``one_of`` of such strategies too).
A failure file's case is checked against it before it is replayed (``docs/trust.md``). A
``.map``, ``.filter`` or ``@composite`` over it declares nothing, unless :func:`bounded_like` says
it keeps within them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from shardfuzz.case import (
    DTYPES,
    EDGE_EXPONENTS,
    EDGE_KINDS,
    EDGE_SLOTS,
    ONE_RANK_PATH,
    PROFILE_PARAMS,
    VALUE_PROFILES,
    Case,
    one_rank_path,
)
from shardfuzz.errors import InvalidArgument
from shardfuzz.spec.bounds import (
    CaseBounds,
    Free,
    Split,
    bounds_of,
    check_int,
    check_range,
    declare,
    mesh_shapes_for,
)

__all__ = [
    "PROFILES",
    "CaseBounds",
    "Free",
    "Split",
    "bounded_like",
    "bounds_of",
    "cases",
    "dp_tp_meshes",
    "dtypes",
    "meshes",
    "mostly",
    "one_rank_path",
    "seeds",
    "sharded_sizes",
    "split_dims",
    "value_profiles",
    "world_sizes",
]

#: value profiles, simplest first. "large" scales values by 10**k (k drawn), "ties" quantises them
#: to a coarse grid so equal values (ties) are common, "small" scales them down, "edge" writes a
#: value at the edge of the dtype (its kind, exponent and slot drawn, so they shrink) into each row.
PROFILES = VALUE_PROFILES


def world_sizes(*, min_size: int = 1, max_size: int = 4) -> st.SearchStrategy[int]:
    """World sizes in ``[min_size, max_size]`` (3 and other non-powers of two included).

    Shrinks toward ``min_size``.
    """
    check_int("min_size", min_size, 1)
    check_int("max_size", max_size, 1)
    check_range("min_size", min_size, "max_size", max_size)
    return st.integers(min_size, max_size)


@st.composite
def meshes(
    draw: Any, *, min_world: int = 1, max_world: int = 4, max_dims: int = 2, world_size: int | None = None
) -> tuple[int, ...]:
    """Mesh shapes: a world size is drawn (or given), then a shape for it of at most ``max_dims``
    axes (:func:`~shardfuzz.spec.bounds.mesh_shapes_for`: 3-D ones from 8 ranks).

    2-D shapes such as ``(2, 2)`` (dp x tp) or ``(2, 1)`` make the implementation's group smaller
    than the world. Shrinks toward the 1-D mesh ``(min_world,)``.
    """
    if world_size is None:
        world_size = draw(world_sizes(min_size=min_world, max_size=max_world))
    return draw(st.sampled_from(mesh_shapes_for(world_size, max_dims=max_dims)))


@st.composite
def sharded_sizes(draw: Any, parts: int, spec: Split = Split()) -> int:
    """A global size for a dim split over ``parts`` ranks, built as ``per_rank * parts + remainder``.

    Shrinks toward ``spec.min_per_rank * parts`` (even), or with ``allow_empty`` toward fewer rows
    than ranks. A non-zero remainder makes it uneven; the smallest uneven size is
    ``min_per_rank * parts + 1``.
    """
    check_int("parts", parts, 1)
    if spec.allow_empty and spec.min_per_rank > 0:  # one more value below the range: the empty one
        below = spec.min_per_rank - 1
        per_rank = draw(st.integers(below, spec.max_per_rank))
        per_rank = 0 if per_rank == below else per_rank
    else:  # min_per_rank 0 needs allow_empty (Split checks it): the same draw as ever
        per_rank = draw(st.integers(spec.min_per_rank, spec.max_per_rank))
    if per_rank == 0:  # only under allow_empty: fewer rows than ranks, but never a global size of 0
        size = draw(st.integers(1, parts - 1)) if parts > 1 else 1
    else:
        size = per_rank * parts + (draw(st.integers(0, parts - 1)) if spec.uneven else 0)
    return max(size, spec.min_size)


def split_dims(ndim: int, *, min_dim: int = 0, max_dim: int | None = None) -> st.SearchStrategy[int]:
    """Which dim of an ``ndim``-d tensor to shard, in ``[min_dim, max_dim]`` (default: the last).

    Shrinks toward ``min_dim`` (dim 0). For a "wrong dim is split" bug, draw the dim the
    implementation shards and the layout from the same value.
    """
    check_int("ndim", ndim, 1)
    hi = ndim - 1 if max_dim is None else max_dim
    check_int("min_dim", min_dim, 0)
    check_int("max_dim", hi, 0)
    check_range("min_dim", min_dim, "max_dim", hi)
    if hi >= ndim:
        raise InvalidArgument(f"max_dim={hi!r}; a {ndim}-d tensor has dims 0..{ndim - 1}")
    return st.integers(min_dim, hi)


def dtypes(*, allowed: Sequence[str] = ("float32", "float64", "bfloat16")) -> st.SearchStrategy[str]:
    """dtype names; shrinks toward the first allowed (float32 by default)."""
    allowed = tuple(allowed)
    bad = [d for d in allowed if d not in DTYPES]
    if not allowed or bad:
        raise InvalidArgument(f"allowed={allowed!r}; choose from {', '.join(DTYPES)}")
    return st.sampled_from(allowed)


def value_profiles(
    *, allowed: Sequence[str] = PROFILES, min_log_scale: int = 1, max_log_scale: int = 4
) -> st.SearchStrategy[tuple[str, dict]]:
    """``(name, params)``: the value profile and its structured parameters.

    ``large`` draws a scale ``10**k`` with ``k`` in ``[min_log_scale, max_log_scale]``; ``ties``
    draws a grid step so that many values are exactly equal; ``edge`` draws the kind of edge value
    (:data:`shardfuzz.case.EDGE_KINDS`), its exponent ``edge_exp`` and the slot of each last-dim
    row it goes to, ``edge_slot`` (``shardfuzz.spec.inputs.apply_edge``). Shrinks toward
    ``("normal", {})``, and an edge toward ``{"edge": "max", "edge_exp": 0, "edge_slot": 0}``.
    """
    allowed = tuple(allowed)
    bad = [p for p in allowed if p not in PROFILES]
    if not allowed or bad:
        raise InvalidArgument(f"allowed={allowed!r}; choose from {', '.join(PROFILES)}")
    check_range("min_log_scale", min_log_scale, "max_log_scale", max_log_scale)
    return _value_profiles(allowed, min_log_scale, max_log_scale)


@st.composite
def _value_profiles(draw, allowed, min_log_scale, max_log_scale):
    name = draw(st.sampled_from(allowed))
    if name == "large":
        return name, {"scale": float(10 ** draw(st.integers(min_log_scale, max_log_scale)))}
    if name == "small":
        return name, {"scale": float(10 ** -draw(st.integers(min_log_scale, max_log_scale)))}
    if name == "ties":
        return name, {"grid": draw(st.sampled_from([0.5, 1.0, 0.25]))}
    if name == "edge":
        return name, {
            "edge": draw(st.sampled_from(EDGE_KINDS)),
            "edge_exp": draw(_EDGE_EXPONENTS),
            "edge_slot": draw(_EDGE_SLOTS),
        }
    return name, {}


_EDGE_EXPONENTS = st.integers(0, EDGE_EXPONENTS - 1)
_EDGE_SLOTS = st.integers(0, EDGE_SLOTS - 1)


def mostly(common: Any, *rare: Any, share: float = 0.95) -> st.SearchStrategy[Any]:
    """``common`` in about ``share`` of the draws, else one of ``rare`` (equally often); shrinks
    toward ``common``. For an option value that is needed to find some bugs but hides others (a
    large logit scale saturates the softmax): rare among random draws, while the covering rows
    still put every value next to every other condition."""
    if not rare:
        raise InvalidArgument("mostly(common): give at least one rare value")
    if not isinstance(share, float) or not 0.0 < share < 1.0:
        raise InvalidArgument(f"share={share!r}; must be a float in (0, 1)")
    # ten coin flips, not integers(0, 1023): Hypothesis draws a wide integer range toward small
    # values (within a case, integers(0, 999) fell below 600 in 89% of draws), so the rare values
    # came up at a quarter of their share; its coins are near fair (46% heads)
    bits = st.lists(st.booleans(), min_size=MOSTLY_BITS, max_size=MOSTLY_BITS)
    return bits.map(functools.partial(_mostly_value, common, rare, round(2**MOSTLY_BITS * share)))


#: the coin flips behind a :func:`mostly` draw (its share in steps of 1/1024)
MOSTLY_BITS = 10


def _mostly_value(common: Any, rare: tuple[Any, ...], cut: int, bits: Sequence[bool]) -> Any:
    """``mostly``'s value for the coin flips ``bits`` (a number in ``[0, 2**len(bits))``, the last
    flip the highest bit, so all False is 0, where it shrinks): ``common`` below ``cut``."""
    i = sum(int(b) << k for k, b in enumerate(bits))
    return common if i < cut else rare[(i - cut) * len(rare) // (2 ** len(bits) - cut)]


def seeds(*, max_seed: int = 2**31 - 1) -> st.SearchStrategy[int]:
    """Input seeds; shrinks toward 0. Drawn last, so a failure keeps its structure while shrinking."""
    check_int("max_seed", max_seed, 0)
    return st.integers(0, max_seed)


def cases(
    target: str,
    *,
    sizes: Mapping[str, Split | Free] | None = None,
    options: Mapping[str, st.SearchStrategy] | None = None,
    late_options: Mapping[str, st.SearchStrategy] | None = None,
    world_sizes: Sequence[int] | None = None,
    min_world: int = 1,
    max_world: int = 4,
    max_dims: int = 2,
    dtypes: Sequence[str] = ("float32", "float64", "bfloat16"),
    profiles: Sequence[str] = ("normal", "large", "ties"),
    mesh_2d_share: float = 0.0,
    strided_inputs: bool = False,
) -> st.SearchStrategy[Case]:
    """Cases of ``target``, drawn in the order that shrinks best (see the module docstring).

    ``world_sizes`` (an explicit list, e.g. from ``--shardfuzz-world-sizes``) overrides
    ``min_world``/``max_world``. Shrinks toward: options' minima, world ``min_world``, a 1-D mesh,
    even sizes at ``min_per_rank``, the first dtype, the ``normal`` profile and seed 0.

    ``mesh_2d_share``: about this share of the cases (0 to 1) is drawn on a mesh whose two axes
    both exceed 1 (dp x tp: ``(2, 2)`` on 4 ranks), from the world sizes that have one; the rest as
    usual, where a world of 4 draws ``(2, 2)`` one time in four. For a dp x tp target, whose bugs
    live where both axes are real. It costs three more choices per case, drawn first (none at 0,
    the default: cases are then the same as without it): whether the case is a dp x tp one, and
    whether each of its two axes is kept (each in 95% of them; one axis alone gives ``(w, 1)`` or
    ``(w,)`` on the smallest world of 2+ ranks from the drawn one). It shrinks toward the usual
    draw, and a bug that needs only one axis shrinks from ``(2, 2)`` to ``(2, 1)`` or ``(2,)``.

    ``strided_inputs``: also draw the option ``strided`` (False or True, last of the late
    options; shrinks to False): True hands the target's ``layout_free`` inputs to the
    implementation as non-contiguous views (``shardfuzz.Target(layout_free=...)``).
    """
    if (
        isinstance(mesh_2d_share, bool)
        or not isinstance(mesh_2d_share, (int, float))
        or not 0 <= mesh_2d_share <= 1
    ):
        raise InvalidArgument(f"mesh_2d_share={mesh_2d_share!r}; must be a number in [0, 1]")
    if not isinstance(target, str) or not target:
        raise InvalidArgument(f"target={target!r}; must be the target's name")
    sizes = dict(sizes or {})
    for name, spec in sizes.items():
        if not isinstance(spec, (Split, Free)):
            raise InvalidArgument(f"sizes[{name!r}]={spec!r}; use Split(...) or Free(...)")
    if world_sizes:
        ws = tuple(sorted(set(world_sizes)))
        for w in ws:
            check_int("world_sizes[i]", w, 1)
        worlds = st.sampled_from(ws)
        drawn_worlds: tuple[int, ...] | range = ws
    else:
        check_int("min_world", min_world, 1)
        check_int("max_world", max_world, 1)
        check_range("min_world", min_world, "max_world", max_world)
        worlds = st.integers(min_world, max_world)
        drawn_worlds = range(min_world, max_world + 1)
    check_int("max_dims", max_dims, 1)
    options, late_options = dict(options or {}), dict(late_options or {})
    # the drawn profiles' parameters go into the same options dict: an option of one's name is
    # overwritten in every case of that profile
    params = {p for profile in profiles for p in PROFILE_PARAMS.get(profile, ())}
    for field, drawn in (("options", options), ("late_options", late_options)):
        taken = sorted(set(drawn) & params)
        if taken:
            raise InvalidArgument(
                f"{field} names {', '.join(map(repr, taken))}: a parameter of the value profiles drawn "
                f"({', '.join(profiles)}) goes into the case's options under that name ({', '.join(sorted(params))}"
                " are taken); rename the option (e.g. 'softmax_scale')"
            )
    if strided_inputs:
        late_options.setdefault("strided", st.booleans())
    bounds = CaseBounds(
        worlds=drawn_worlds,
        max_dims=max_dims,
        sizes=tuple(sizes.items()),
        profiles=tuple(profiles),
        options=frozenset(options) | frozenset(late_options),
    )
    dp_tp = tuple(w for w in drawn_worlds if dp_tp_meshes(w)) if max_dims >= 2 else ()
    strategy = _cases(
        target,
        sizes,
        options,
        late_options,
        worlds,
        1 in drawn_worlds,  # the 1-rank path
        max_dims,
        _dtypes(allowed=dtypes),
        value_profiles(allowed=profiles),
        round(100 * mesh_2d_share) if dp_tp else 0,
        dp_tp,
        tuple(drawn_worlds),
    )
    return declare(strategy, [bounds])


def bounded_like(strategy: st.SearchStrategy[Case], like: st.SearchStrategy[Case]) -> st.SearchStrategy[Case]:
    """``strategy``, declared to draw only cases within the bounds of ``like`` (a strategy of
    :func:`cases`, or a ``one_of`` of them): for a wrapper that draws a case of ``like`` and
    changes option values (``targets/redistribute.py``) or moves a ``Free`` size within its own
    bounds (GQA's head counts rounded to what the group needs). A failure file's case is checked
    against these bounds before it is replayed (``docs/trust.md``); a ``.map``, ``.filter`` or
    ``@composite`` strategy declares none unless wrapped so. A run checks every case it draws
    against them: one outside is a usage error naming the size. Returns ``strategy``."""
    return declare(strategy, bounds_of(like))


@st.composite
def _cases(
    draw: Any,
    target: Any,
    sizes: Any,
    options_s: Any,
    late: Any,
    worlds: Any,
    one_rank_allowed: Any,
    max_dims: Any,
    dtype_s: Any,
    profile_s: Any,
    dp_tp_percent: int = 0,
    dp_tp_worlds: tuple[int, ...] = (),
    all_worlds: tuple[int, ...] = (),
) -> Case:
    # first, only with mesh_2d_share: 0 (what it shrinks to) draws as usual
    dp_tp = keep_dp = keep_tp = False
    if dp_tp_percent > 0:
        dp_tp = draw(_PERCENT) >= 100 - dp_tp_percent
        # each axis of a dp x tp draw stays real in 95% of them and shrinks to not real: without
        # these, the world and mesh choices that a dp x tp draw overrides shrink to their minimum,
        # and a bug that needs only the dp axis (or only the tp one) stayed on (2, 2) when (2, 1)
        # (or (2,)) fails too. Drawn in every case, so that turning the dp x tp draw off leaves
        # the later choices where they were
        keep_dp, keep_tp = draw(_PERCENT) >= 5, draw(_PERCENT) >= 5
    opts = {k: draw(v) for k, v in options_s.items()}
    world = draw(worlds)
    mesh = draw(_meshes_of(world, max_dims))  # in every case: the same choices as the usual draw
    if dp_tp and keep_dp and keep_tp:  # the drawn world, up to the next one with a dp x tp mesh
        world = next((w for w in dp_tp_worlds if w >= world), dp_tp_worlds[-1])
        mesh = draw(st.sampled_from(dp_tp_meshes(world)))
    elif dp_tp and (
        keep_dp or keep_tp
    ):  # one real axis, on the smallest world of 2+ ranks from the drawn one
        world = next(w for w in all_worlds if w >= max(world, 2))
        mesh = (world, 1) if keep_dp else (world,)
    group = mesh[-1]
    drawn: dict[str, int] = {}
    split: list[str] = []
    for name, spec in sizes.items():
        if isinstance(spec, Split):  # over the group, or over its replicas (a dp-split batch)
            drawn[name] = draw(_sharded_sizes_of(spec.parts(group, world // group), spec))
            if spec.over == "group":
                split.append(name)
        else:
            drawn[name] = draw(st.integers(spec.min_size, spec.max_size))
    dtype = draw(dtype_s)
    profile, params = draw(profile_s)
    opts.update(params)
    opts.update({k: draw(v) for k, v in late.items()})
    seed = draw(_SEEDS)
    if ONE_RANK_PATH.get() and one_rank_allowed and world > 1 and draw(st.integers(0, 1)) == 0:
        world, mesh = 1, (1,)  # the sizes stay as drawn for the group
    return Case(
        target=target,
        world_size=world,
        mesh=mesh,
        sizes=drawn,
        split=tuple(split),
        dtype=dtype,
        profile=profile,
        seed=seed,
        options=opts,
    )


_PERCENT = st.integers(0, 99)


def dp_tp_meshes(world_size: int) -> list[tuple[int, ...]]:
    """The 2-D meshes of ``world_size`` whose two axes both exceed 1 (dp x tp), squarest first."""
    return [m for m in mesh_shapes_for(world_size, max_dims=2) if len(m) == 2 and min(m) > 1]


# The strategies :func:`_cases` draws from, made once per argument: a composite strategy made anew
# at every draw is validated and checked for emptiness anew too, which cost about as much as the
# draw itself. The same objects draw the same choices, so searches and shrinks are unchanged.
@functools.cache
def _meshes_of(world: int, max_dims: int) -> st.SearchStrategy[tuple[int, ...]]:
    return meshes(world_size=world, max_dims=max_dims)


@functools.cache
def _sharded_sizes_of(parts: int, spec: Split) -> st.SearchStrategy[int]:
    return sharded_sizes(parts, spec)


_SEEDS = seeds()
_dtypes = dtypes
