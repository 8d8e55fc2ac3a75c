"""Where the wrong elements of a mismatching output sit: per rank, the runs of wrong local indices
along each dim, and a small character grid of the global value with the shard boundaries drawn.

Everything comes from the compared pieces alone: each rank's mask of wrong elements and its
layout's local -> global index map (``RankDiff.to_global``), so it works for any layout. The map
of one dim is read as runs of ``global = local + offset`` (a ``Shard`` piece is one run, a
``Zigzag`` piece two), found by a galloping search: a handful of calls, whatever the size. A layout
whose index map does not separate by dim (no built-in one) would be misdrawn, never mis-compared.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from shardfuzz.spec.layouts import split_sizes

if TYPE_CHECKING:
    from shardfuzz.verdict.compare import OutputDiff, RankDiff

MAX_ROWS, MAX_COLS, MAX_RUNS = 16, 32, 4

Segment = tuple[int, int, int]  # (local start, length, global start)


def segments(
    to_global: Callable[[tuple[int, ...]], tuple[int, ...]], shape: tuple[int, ...], d: int
) -> list[Segment]:
    """Dim ``d``'s local -> global map as runs of consecutive global indices."""
    n, out, i = shape[d], [], 0

    def at(j: int) -> int:
        idx = [0] * len(shape)
        idx[d] = j
        return int(to_global(tuple(idx))[d])

    while i < n:
        off = at(i) - i
        same = lambda j, off=off: at(j) - j == off
        lo, hi, step = i, n, 1  # same(lo); the run ends in (lo, hi]: gallop, then bisect
        while lo + step < n:
            if not same(lo + step):
                hi = lo + step
                break
            lo, step = lo + step, step * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if same(mid) else (lo, mid)
        out.append((i, hi - i, off + i))
        i = hi
    return out


def runs(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted indices merged into inclusive runs: [3, 4, 5, 9] -> [(3, 5), (9, 9)]."""
    out: list[tuple[int, int]] = []
    for v in indices:
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def format_runs(rs: list[tuple[int, int]], n: int | None = None) -> str:
    """Runs of indices of a dim of ``n`` (``index 2 of 3``, ``indices 3-5, 9 of 12``, ``all 6``):
    the word ``index`` because "2 of 3" alone read as a count of wrong elements."""
    if n is not None and rs == [(0, n - 1)]:
        return f"all {n}"
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in rs[:MAX_RUNS])
    if len(rs) > MAX_RUNS:
        text += f", ... ({len(rs) - MAX_RUNS} more runs)"
    if n is None:
        return text
    return ("index " if rs == [(rs[0][0], rs[0][0])] else "indices ") + text + f" of {n}"


def _to_global_runs(rs: list[tuple[int, int]], segs: list[Segment]) -> list[tuple[int, int]]:
    hit: list[int] = []
    for a, b in rs:
        for lo, k, g in segs:
            x, y = max(a, lo), min(b, lo + k - 1)
            if x <= y:
                hit += range(g + x - lo, g + y - lo + 1)
    return runs(sorted(set(hit)))


@dataclasses.dataclass
class Piece:
    """One compared piece: a rank's local, or (rank None) an assembled sum over ranks."""

    rank: int | None
    local: Any  # the compared tensor
    wrong: Any  # bool mask over it (None: nothing wrong, or not compared elementwise)
    segs: list[list[Segment]]  # per dim
    bad: bool = False

    @classmethod
    def of(cls, rd: RankDiff) -> Piece:
        shape = tuple(rd.local.shape)
        to_global = rd.to_global or (lambda idx: idx)
        segs = [segments(to_global, shape, d) for d in range(len(shape))]
        return cls(rd.rank, rd.local, rd.wrong, segs, rd.bad > 0)

    @property
    def clean(self) -> bool:
        """Within the tolerance everywhere (compared element by element, none wrong)."""
        return not self.bad and (self.wrong is None or not bool(self.wrong.any()))


@dataclasses.dataclass
class GlobalView:
    """One replica's pieces put back where they sit in the global value."""

    wrong: Any  # bool, the global shape
    actual: Any  # float64 (complex128), a wrong rank's values where pieces overlap
    cuts: list[list[int]]  # per dim, the global indices where a piece starts or ends (0 < cut < n)
    ranks: list[int]  # the world ranks of the replica ([] for a sum over ranks)


def pieces_of(od: OutputDiff) -> list[Piece]:
    return [Piece.of(rd) for rd in od.ranks if rd.local is not None and hasattr(rd.local, "shape")]


def global_views(od: OutputDiff, pieces: list[Piece] | None = None) -> list[GlobalView]:
    """The global view of each replica (each sum over ranks, for a Partial output)."""
    pieces = pieces_of(od) if pieces is None else pieces
    if any(p.rank is None for p in pieces):
        return [_view(od.shape, [p]) for p in pieces]
    return [_view(od.shape, g) for g in replica_groups(od, pieces) if g]


def replica_groups(od: OutputDiff, pieces: list[Piece]) -> list[list[Piece]]:
    """The ranks' pieces of each replica (``od.groups``; all of them where it names none)."""
    by_rank = {p.rank: p for p in pieces if p.rank is not None}
    return [[by_rank[r] for r in g if r in by_rank] for g in (od.groups or [list(by_rank)])]


def _view(shape: tuple[int, ...], group: list[Piece]) -> GlobalView:
    complex_ = any(p.local.is_complex() for p in group)
    wrong = torch.zeros(shape, dtype=torch.bool)
    actual = torch.full(shape, float("nan"), dtype=torch.complex128 if complex_ else torch.float64)
    cuts: list[set[int]] = [set() for _ in shape]
    # clean pieces first: where pieces overlap (Replicate), a wrong rank's values are the ones shown
    for p in sorted(group, key=lambda p: p.wrong is not None):
        for d, segs in enumerate(p.segs):
            cuts[d].update(c for _, k, g in segs for c in (g, g + k) if 0 < c < shape[d])
        for box in itertools.product(*p.segs):
            src = tuple(slice(lo, lo + k) for lo, k, _ in box)
            dst = tuple(slice(g, g + k) for _, k, g in box)
            actual[dst] = p.local[src].to(actual.dtype)
            if p.wrong is not None:
                wrong[dst] |= p.wrong[src]
    return GlobalView(wrong, actual, [sorted(c) for c in cuts], [p.rank for p in group if p.rank is not None])


def sharded_dims(pieces: list[Piece], shape: tuple[int, ...]) -> list[int]:
    return [d for d in range(len(shape)) if any(p.segs[d] != [(0, shape[d], 0)] for p in pieces)]


def assembled(layout: str) -> str:
    """What a Partial output's compared value is, by its reduction (the layout text names it):
    "the sum over ranks", "the max over ranks", ..."""
    for marker, name in (
        ("Partial(max", "max"),
        ("Partial(min", "min"),
        ("Partial(avg", "mean"),
        ("Partial(product", "product"),
        ("_NormPartial", "norm"),
    ):
        if marker in layout:
            return f"the {name} over ranks"
    return "the sum over ranks"


def _who_holds(od: OutputDiff, pieces: int) -> str:
    """Who holds an unsplit output: one rank of each group (an owner), or every rank; a group of one
    rank (mesh (3, 1)) holds it on each rank, which is not "one rank" of a replicated value."""
    groups: list[list[int]] = od.groups or [[]]
    if all(len(g) == 1 for g in groups):
        return "each rank holds" if len(groups) > 1 else "the one rank holds"
    return "one rank holds" if pieces <= len(groups) else "every rank holds"


def describe(od: OutputDiff, rank_label: Callable[[int], str]) -> list[str]:
    """The map's lines (indented for :func:`shardfuzz.report.findings.format_output_diff`)."""
    pieces = pieces_of(od)
    if not pieces or not od.shape:
        return ["  map: " + ("a 0-d value" if pieces else "a non-tensor value") + ", nothing to map"]
    shape = tuple(od.shape)
    sharded = sharded_dims(pieces, shape)
    if pieces[0].rank is None:
        head = f"{assembled(od.layout)} is compared ({od.layout}): no one rank holds these elements"
    elif sharded:
        dims = ("dims " if len(sharded) > 1 else "dim ") + ", ".join(map(str, sharded))
        head = f"{dims} split over the ranks ({od.layout}); local indices, global in brackets"
    else:
        head = f"{_who_holds(od, len(pieces))} the whole value ({od.layout}); indices are global"
    lines = [f"  map of the wrong elements: {head}"]
    clean = []
    for p in pieces:
        who = rank_label(p.rank) if p.rank is not None else assembled(od.layout).split()[1]  # "max", ...
        if p.clean:
            clean.append(f"{p.rank}" + (" (empty)" if p.local.numel() == 0 else ""))
            continue
        if p.wrong is None or not bool(p.wrong.any()):
            lines.append(f"    {who}: wrong (not compared element by element)")
            continue
        where = []  # the sharded dims, and the others where not every index is hit
        for d in range(p.wrong.ndim):
            others = tuple(x for x in range(p.wrong.ndim) if x != d)
            hit = p.wrong.any(dim=others) if others else p.wrong
            rs = runs(hit.nonzero().flatten().tolist())
            if d not in sharded and rs == [(0, p.wrong.shape[d] - 1)]:
                continue
            text = f"dim {d}: {format_runs(rs, p.wrong.shape[d])}"
            if d in sharded:
                text += f" [global {format_runs(_to_global_runs(rs, p.segs[d]))}]"
            where.append(text)
        if not where:
            n, k = p.wrong.numel(), int(p.wrong.sum())
            where = ["every element" if k == n else f"{k} of {n} elements, in every index of every dim"]
        lines.append(f"    {who}: wrong at " + "; ".join(where))
    if clean:
        lines.append(f"    clean: rank{'s' if len(clean) > 1 else ''} {', '.join(clean)}")
    # groups of one rank each (a mesh (2, 1)) hold one value too, copy by copy
    replicated = head.startswith(("every rank holds", "each rank holds"))
    lines += _disagreement(od, pieces, rank_label, replicated=replicated)
    lines += _copies_apart(od, pieces, rank_label, replicated)
    lines += _assembled_scaled(od, pieces, replicated)
    return lines + _grid_lines(od, pieces, sharded)


def _disagreement(
    od: OutputDiff, pieces: list[Any], rank_label: Callable[[int], str], replicated: bool
) -> list[str]:
    """Whether the ranks of a ``replicated`` value hold the same values: ranks that disagree point
    at a value each computed apart (a gradient never all-reduced), not at a wrong shared computation;
    and whether what they hold sums to the oracle, group by group (a partial sum never reduced)."""
    if not replicated:
        return []
    first = pieces[0]
    apart = []
    for p in pieces[1:]:
        if p.local.shape != first.local.shape or not (
            p.local.is_floating_point() and first.local.is_floating_point()
        ):
            continue
        gap = _max_gap(p.local, first.local)
        if gap > 0:
            apart.append(f"{rank_label(p.rank)} by up to {gap:.3g}")
    if not apart:
        return _scaled_by_the_group(od, pieces)
    lines = [f"    the ranks hold different values: against {rank_label(first.rank)}, " + ", ".join(apart)]
    if _sums_to_the_oracle(od, pieces):
        each = " in each group" if len(od.groups) > 1 else ""
        lines.append(
            f"    what the ranks hold sums to the oracle{each}, within its tolerance: a partial sum never "
            "reduced (a Partial value returned as Replicate, or an all_reduce missing)"
        )
    return lines


def _max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference between two copies of one value (0: none). The same infinity, or NaN
    on both, is the same value (inf - inf is nan: "by up to inf" was said of ranks that all held
    -inf); a NaN beside a number is as far apart as can be; an infinite gap stays inf (nan_to_num's
    default turns it into 1.8e+308, which a new user read as a clamp beside the block's "inf")."""
    a, b = a.double(), b.double()
    same = (a == b) | (a.isnan() & b.isnan())
    gap = torch.where(same, 0.0, (a - b).abs().nan_to_num(nan=math.inf, posinf=math.inf))
    return float(gap.max()) if gap.numel() else 0.0


def _copies_apart(
    od: OutputDiff, pieces: list[Piece], rank_label: Callable[[int], str], replicated: bool
) -> list[str]:
    """For a value split over some ranks and copied over others (a DTensor ``(Shard(0),
    Replicate())`` on a dp x tp mesh): whether the ranks that hold the same elements hold the same
    values, and whether, where every element is held by two or more, the copies sum to the oracle
    (a partial sum never reduced over the copies: a new user's Partial output labelled Replicate
    on a mesh (2, 2) got no hint, where the same bug on a mesh (2,) got :func:`_disagreement`'s)."""
    if replicated or not pieces or any(p.rank is None or not p.local.is_floating_point() for p in pieces):
        return []
    label: dict[int | None, str] = {p.rank: rank_label(p.rank) for p in pieces if p.rank is not None}
    places: dict[tuple, list[Piece]] = {}
    for p in pieces:
        places.setdefault(tuple(tuple(segs) for segs in p.segs), []).append(p)
    apart = []
    for held in places.values():
        for p in held[1:]:
            if p.local.shape != held[0].local.shape:
                return []
            gap = _max_gap(p.local, held[0].local)
            if gap > 0:
                apart.append(f"{label[p.rank]} against {label[held[0].rank]} by up to {gap:.3g}")
    if not apart:
        return []
    lines = ["    ranks that hold the same elements hold different values: " + ", ".join(apart)]
    return lines + _copies_sum_to_the_oracle(od, list(places.values()))


def _copies_sum_to_the_oracle(od: OutputDiff, places: list[list[Piece]]) -> list[str]:
    """The line of :func:`_copies_apart` where every element is held by two or more ranks and what
    they hold, summed, is the oracle within its bound."""
    ref, bound = od.ref, od.bound
    if not (isinstance(ref, torch.Tensor) and ref.is_floating_point() and isinstance(bound, torch.Tensor)):
        return []
    # a copy right on its own beside copies of zeros is a value never sent, not parts of a sum
    if any(len(held) < 2 or any(p.clean for p in held) for held in places):
        return []
    total = torch.zeros(tuple(od.shape), dtype=torch.float64)
    covered = torch.zeros(tuple(od.shape), dtype=torch.bool)
    for held in places:
        summed = torch.stack([p.local.double() for p in held]).sum(0)
        for box in itertools.product(*held[0].segs):
            src = tuple(slice(lo, lo + k) for lo, k, _ in box)
            dst = tuple(slice(g, g + k) for _, k, g in box)
            total[dst] = summed[src]
            covered[dst] = True
    r = ref.double()
    if not (bool(covered.all()) and total.shape == r.shape and bool(((total - r).abs() <= bound).all())):
        return []
    return [
        "    what those ranks hold sums to the oracle, within its tolerance: a partial sum never "
        "reduced over the ranks that hold copies (a Partial placement returned as Replicate, or an "
        "all_reduce missing on that mesh axis)"
    ]


def _weighable(od: OutputDiff) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The oracle (float64) and the bound of an output whose value a factor can be weighed
    against: floating, with a bound, and not within its own tolerance of 0 (any multiple of such
    an oracle fits); None otherwise."""
    ref, bound = od.ref, od.bound
    if not (isinstance(ref, torch.Tensor) and ref.is_floating_point() and isinstance(bound, torch.Tensor)):
        return None
    r = ref.double()
    return (r, bound) if bool((r.abs() > bound).any()) else None


def _scaled_by_the_group(od: OutputDiff, pieces: list[Any]) -> list[str]:
    """Where every rank of each group holds the same value and that is its group's size times the
    oracle, or the oracle over it, within the tolerance scaled alike: a reduction done once too
    often (a new user's LayerNorm gradients all-reduced again after DTensor had reduced them: every
    element exactly 2x on 2 ranks, and the report gave no hint). Or the world's size times it,
    where that is not the group's: a collective over the world where the group was due (a new
    user's all_reduce on dist.group.WORLD, on a mesh (2, 1), gave exactly 2x and no hint)."""
    oracle = _weighable(od)
    if oracle is None:
        return []
    r, bound = oracle
    groups = _groups_to_weigh(od, pieces)
    sizes = {len(g) for g in groups}
    everyone = [p for g in replica_groups(od, pieces) for p in g]
    world = len(everyone)
    tries: list[tuple[float, str, list[list[Any]], str]] = []
    if len(sizes) == 1:
        k = sizes.pop()
        each = " in each group" if len(groups) > 1 else ""
        tries += [
            (
                k,
                f"{k} times the oracle{each}",
                groups,
                "as if reduced once too often (an all_reduce of a value already whole, or a sum where a "
                "mean was due), or computed from a value off by that factor (other outputs wrong alike?)",
            ),
            (
                1 / k,
                f"1/{k} of the oracle{each}",
                groups,
                "as if divided by the group size once too often (a mean of a mean, or a mean where a sum "
                "was due), or computed from a value off by that factor (other outputs wrong alike?)",
            ),
        ]
    group = len(od.groups[0]) if od.groups else world
    if world >= 2 and world != group:
        over = f"the world's size, {world}, where the group has {group} rank{'s' if group != 1 else ''}"
        tries += [
            (
                world,
                f"{world} times the oracle ({over})",
                [everyone],
                "as if reduced over the world where the group was due (a collective on the default "
                "group, dist.group.WORLD or group=None, in the group's place)",
            ),
            (
                1 / world,
                f"1/{world} of the oracle ({over})",
                [everyone],
                "as if divided by the world's size where the group's was due",
            ),
        ]
    for factor, says, weighed, why in tries:
        fits = all(
            p.local.shape == r.shape
            and p.local.is_floating_point()
            and _scaled_fits(p.local, r, bound, factor)
            for g in weighed
            for p in g
        )
        if fits:
            # "as if": a value it is computed from, off by the same factor, fits too (a new user's
            # GNN degree counted from local edges only read as an all_reduce done twice)
            return [f"    every rank holds {says}, within its tolerance scaled alike: {why}"]
    return []


#: a factor explains a wrong element when it leaves at most this share of its error
EXPLAINED_SHARE = 0.25


def _scaled_fits(actual: torch.Tensor, r: torch.Tensor, bound: torch.Tensor, factor: float) -> bool:
    """Whether ``actual`` is ``factor`` times the oracle ``r`` within the bound scaled alike, and
    the factor explains the error of every element outside the bound (it leaves at most
    :data:`EXPLAINED_SHARE` of it): where 16-bit bounds are wide, a small value fits any factor,
    and a pipeline's wrong recv buffer (rank 1's element 2.53x the oracle) read as "2 times the
    oracle ... a sum where a mean was due"."""
    a = actual.double()
    off = (a - factor * r).abs()
    if not bool((off <= max(factor, 1.0) * bound).all()):
        return False
    wrong = (a - r).abs() > bound
    return bool((off[wrong] <= EXPLAINED_SHARE * (a - r).abs()[wrong]).all())


def _assembled_scaled(od: OutputDiff, pieces: list[Piece], replicated: bool) -> list[str]:
    """For a value split over the ranks (not ``replicated``, no sum over ranks): where each replica,
    put back together, is its group's size times the oracle, or the oracle over it, within the
    tolerance scaled alike (a new user's k and v gradients all-reduced and averaged over 2 ranks
    where a reduce-scatter's sum was due: every element exactly half, and the report said only
    "greatest relative difference: 0.5")."""
    if replicated or not pieces or any(p.rank is None for p in pieces):
        return []
    oracle = _weighable(od)
    if oracle is None:
        return []
    r, bound = oracle
    views = global_views(od, pieces)
    if not views or any(v.actual.shape != r.shape or bool(v.actual.isnan().any()) for v in views):
        return []  # a piece missing, or a value that is not a number: nothing to weigh
    sizes = {len(g) for g in replica_groups(od, pieces)}
    if len(sizes) != 1 or (k := sizes.pop()) < 2:
        return []
    each = " in each replica" if len(views) > 1 else ""
    for factor, says, why in (
        (k, f"{k} times the oracle", "a sum where a mean was due, or a value reduced once too often"),
        (
            1 / k,
            f"1/{k} of the oracle",
            "a mean where a sum was due (an all-reduce averaged, where a "
            "reduce-scatter or an all-reduce summed), or divided by the group size once too often",
        ),
    ):
        if all(_scaled_fits(v.actual, r, bound, factor) for v in views):
            return [
                f"    the ranks' pieces, put together{each}, are {says} (group of {k}), within its tolerance "
                f"scaled alike: as if {why}, or computed from a value off by that factor"
            ]
    return []


def _groups_to_weigh(od: OutputDiff, pieces: list[Any]) -> list[Any]:
    """The replica groups whose copies can be weighed against the oracle (a floating reference with
    its bound, every group of two or more ranks); none otherwise."""
    ref, bound = od.ref, od.bound
    if not (isinstance(ref, torch.Tensor) and ref.is_floating_point() and isinstance(bound, torch.Tensor)):
        return []
    groups = replica_groups(od, pieces)
    return groups if groups and all(len(g) >= 2 for g in groups) else []


def _sums_to_the_oracle(od: OutputDiff, pieces: list[Any]) -> bool:
    """Every group of two or more ranks holds values whose sum is within the bound of the oracle's
    global value (a new user's Partial gradient labelled Replicate read only "the ranks differ")."""
    groups = _groups_to_weigh(od, pieces)
    if not groups:
        return False
    ref, bound = od.ref, od.bound
    for g in groups:
        if any(p.local.shape != ref.shape or not p.local.is_floating_point() for p in g):
            return False
        # a rank right on its own beside ranks of zeros is a value never sent (a broadcast
        # missing), not parts of a sum
        if any(p.clean for p in g):
            return False
        total = torch.stack([p.local.double() for p in g]).sum(0)
        if not bool(((total - ref.double()).abs() <= bound).all()):
            return False
    return True


def _grid_lines(od: OutputDiff, pieces: list[Piece], sharded: list[int]) -> list[str]:
    views = [v for v in global_views(od, pieces) if bool(v.wrong.any())]
    if not views:
        return []
    v = views[0]
    if bool(v.wrong.all()):
        # a replicated output's view marks an element wrong on any rank (the ranks above say where)
        some = " on at least one rank" if od.layout.startswith("Replicate") and len(v.ranks) > 1 else ""
        return [f"    (every element of the global value is wrong{some}: no grid)"]
    shape = tuple(v.wrong.shape)
    rows, cols = grid_dims(shape, sharded)
    if rows is None:
        w2 = v.wrong.reshape(1, shape[cols])
    else:
        w2 = v.wrong.movedim((rows, cols), (0, 1)).reshape(shape[rows], shape[cols], -1).any(-1)
    r_cells = cells(w2.shape[0], v.cuts[rows] if rows is not None else [], MAX_ROWS)
    c_cells = cells(w2.shape[1], v.cuts[cols], MAX_COLS)
    axis = lambda d, cs: (
        f"dim {d} ({shape[d]}" + (f" in {len(cs[0])} cells)" if len(cs[0]) < shape[d] else ")")
    )
    what = f"rows {axis(rows, r_cells)} x cols " if rows is not None else "cols "
    where = f" of ranks {v.ranks}" if len(views) > 1 or len(od.groups) > 1 else ""
    folded = ", other dims folded" if len(shape) > 2 else ""
    lines = [
        f"    grid{where}, {what}{axis(cols, c_cells)}{folded}; '#' wrong, '.' right, '-' '|' piece ends:"
    ]
    return lines + ["      " + line for line in render(w2, r_cells, c_cells)]


def grid_dims(shape: tuple[int, ...], sharded: list[int]) -> tuple[int | None, int]:
    """The dims drawn as rows and cols: a sharded dim and the largest other one, in dim order;
    a 1-d value is one row."""
    if len(shape) == 1:
        return None, 0
    first = sharded[0] if sharded else max(range(len(shape)), key=lambda d: (shape[d], d))
    other = max((d for d in range(len(shape)) if d != first), key=lambda d: (shape[d], d))
    a, b = sorted((first, other))
    return a, b


def cells(n: int, cuts: list[int], budget: int) -> tuple[list[tuple[int, int]], set[int]]:
    """Cut ``n`` indices into at most ``budget`` cells (separators included) that never straddle
    a cut; returns the cells and the cells after which a separator goes. With more pieces than
    fit, the cells are even and the separators left out."""
    bounds = [0, *cuts, n]
    segs = [(a, b - a) for a, b in itertools.pairwise(bounds) if b > a]
    room = budget - (len(segs) - 1)
    if room < len(segs):  # too many pieces to draw apart
        segs, room = [(0, n)], budget
    if n <= room:
        alloc = [k for _, k in segs]
    else:
        alloc = [max(1, min(k, round(room * k / n))) for _, k in segs]
        while sum(alloc) > room:
            alloc[alloc.index(max(alloc))] -= 1
    out: list[tuple[int, int]] = []
    seps = set()
    for (start, k), c in zip(segs, alloc):
        for size in split_sizes(k, c, "tensor_split"):
            out.append((start, start + size))
            start += size
        seps.add(len(out) - 1)
    seps.discard(len(out) - 1)
    return out, seps


def render(
    w2: Any, r_cells: tuple[list[tuple[int, int]], set[int]], c_cells: tuple[list[tuple[int, int]], set[int]]
) -> list[str]:
    """The grid's lines: '#' where a cell holds a wrong element."""
    (rc, rsep), (cc, csep) = r_cells, c_cells
    lines = []
    for i, (r0, r1) in enumerate(rc):
        band = w2[r0:r1].any(0)
        line = "".join(
            ("#" if bool(band[c0:c1].any()) else ".") + ("|" if j in csep else "")
            for j, (c0, c1) in enumerate(cc)
        )
        lines.append(line)
        if i in rsep:
            lines.append("".join("-" + ("+" if j in csep else "") for j in range(len(cc))))
    return lines
