"""Communication accounting: collectives and bytes per rank and per op, the alpha-beta estimate of
each collective, and whether a case kept the budget its implementation declared
(:mod:`shardfuzz.spec.budget`).

Bytes come from the collective trace (:mod:`shardfuzz.ranks.trace`) and the bandwidth-optimal
algorithms, not from the wire (gloo and NCCL pick their own algorithms): with ``S`` the
collective's size in bytes and ``n`` its group size, a rank sends and receives

* all-reduce: ``2 (n-1)/n * S`` (ring: a reduce-scatter, then an all-gather);
* all-gather (``S`` the output) and reduce-scatter (``S`` the input): ``(n-1)/n * S``;
* all-to-all: exactly its splits to and from the other ranks;
* send / recv: the tensor; broadcast, reduce, gather, scatter: what must leave or reach the root;
* barrier and object collectives: 0 bytes (counted as collectives).

The alpha-beta model times one step as ``alpha + bytes / beta`` (defaults: the handbook's 5 us
and 200 GB/s): an all-reduce takes ``2(n-1)`` ring steps of ``S/n`` or ``2 ceil(log2 n)`` tree
steps of ``S``; :func:`estimate` has the formula of every op.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from shardfuzz.errors import InvalidArgument, TargetCodeError
from shardfuzz.ranks.trace import POINT_TO_POINT, Collective

# the budget a target declares is spec; re-exported for 0.1 callers of shardfuzz.comm
from shardfuzz.spec.budget import ITEMSIZE as ITEMSIZE
from shardfuzz.spec.budget import CommBudget as CommBudget
from shardfuzz.spec.budget import all_gather_bytes as all_gather_bytes
from shardfuzz.spec.budget import all_reduce_bytes as all_reduce_bytes
from shardfuzz.spec.budget import budget_for

Traces = Mapping[int, Sequence[Collective]]

ALGORITHMS = ("ring", "tree", "both")
ROOTED = ("broadcast", "reduce", "gather", "scatter")


@dataclasses.dataclass(frozen=True)
class CostModel:
    """The alpha-beta model: ``alpha`` seconds per step, ``beta`` bytes per second."""

    alpha: float = 5e-6
    beta: float = 200e9
    algorithm: str = "both"

    def __post_init__(self) -> None:
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 <= v < math.inf):
                raise InvalidArgument(f"{name}={v!r}; must be a finite number >= 0")
        if self.beta <= 0:
            raise InvalidArgument(f"beta={self.beta!r}; must be > 0 (bytes per second)")
        if self.algorithm not in ALGORITHMS:
            raise InvalidArgument(f"algorithm={self.algorithm!r}; allowed: {', '.join(ALGORITHMS)}")


#: the units `--alpha` (a latency) and `--beta` (a bandwidth) accept
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
RATE_UNITS = {"B/s": 1.0, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12}


def parse_quantity(text: str, units: Mapping[str, float], what: str) -> float:
    """``"5us"`` -> 5e-6, ``"200GB/s"`` -> 2e11 (a bare number is in the base unit)."""
    t = text.strip()
    for unit, scale in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if t.endswith(unit) and t[: -len(unit)].strip():
            t, factor = t[: -len(unit)], scale
            break
    else:
        factor = 1.0
    try:
        value = float(t) * factor
    except ValueError:
        value = math.nan
    if not (0 <= value < math.inf):
        raise InvalidArgument(f"{what}={text!r}; expected a number >= 0 with a unit ({', '.join(units)})")
    return value


@dataclasses.dataclass(frozen=True)
class Traffic:
    """One collective as one rank sees it: ``size`` is ``S`` of the formulas."""

    op: str
    group_size: int
    size: float
    sent: float
    received: float


def _bytes(shapes: Sequence[tuple[int, ...]], dtype: str) -> int:
    return sum(math.prod(s) for s in shapes) * ITEMSIZE.get(dtype, 4)


def traffic(c: Collective, rank: int) -> Traffic:
    """What ``rank`` sends and receives in collective ``c`` (the module's formulas)."""
    n, item = max(len(c.group), 1), ITEMSIZE.get(c.dtype, 4)
    inb, outb = _bytes(c.shapes, c.dtype), _bytes(c.out_shapes, c.dtype)
    op, frac = c.op, (n - 1) / n
    if n == 1 and op not in POINT_TO_POINT:
        return Traffic(op, 1, inb, 0.0, 0.0)
    if op in ("all_reduce", "all_reduce_coalesced"):
        return Traffic(op, n, inb, 2 * frac * inb, 2 * frac * inb)
    if op in ("all_gather", "all_gather_into_tensor", "all_gather_into_tensor_coalesced"):
        return Traffic(op, n, n * inb, frac * n * inb, frac * n * inb)
    if op in ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
        return Traffic(op, n, inb, frac * inb, frac * inb)
    if op in ("all_to_all", "all_to_all_single") and c.splits is not None:
        me = c.group.index(rank) if rank in c.group else -1
        sent = sum(s for i, s in enumerate(c.splits[0]) if i != me) * item
        received = sum(s for i, s in enumerate(c.splits[1]) if i != me) * item
        return Traffic(op, n, inb, sent, received)
    if op == "send":
        return Traffic(op, 2, inb, inb, 0.0)
    if op == "recv":
        return Traffic(op, 2, outb, 0.0, outb)
    root = c.peer == rank
    if op == "broadcast":
        return Traffic(op, n, inb, inb if root else 0.0, 0.0 if root else inb)
    if op == "reduce":
        return Traffic(op, n, inb, 0.0 if root else inb, (n - 1) * inb if root else 0.0)
    if op == "gather":
        return Traffic(op, n, n * inb, 0.0 if root else inb, (n - 1) * inb if root else 0.0)
    if op == "scatter":
        part = outb
        return Traffic(op, n, n * part, (n - 1) * part if root else 0.0, 0.0 if root else part)
    return Traffic(op, n, 0.0, 0.0, 0.0)  # barrier, object collectives


def estimate(op: str, n: int, size: float, algorithm: str, model: CostModel) -> float:
    """Seconds for one collective of ``size`` bytes on ``n`` ranks by ``algorithm`` (ring or tree)."""
    a, b = model.alpha, model.beta
    if op in POINT_TO_POINT:
        return a + size / b
    if n <= 1:
        return 0.0
    logn = math.ceil(math.log2(n))
    ring = algorithm == "ring"
    if op in ("all_reduce", "all_reduce_coalesced"):  # ring: RS + AG; tree: reduce + broadcast
        return 2 * (n - 1) * (a + size / (n * b)) if ring else 2 * logn * (a + size / b)
    if op.startswith(("all_gather", "reduce_scatter", "gather", "scatter")):
        return (n - 1) * (a + size / (n * b)) if ring else logn * a + (n - 1) / n * size / b
    if op.startswith("all_to_all"):  # ring: pairwise exchange; tree: Bruck's log n rounds of S/2
        return (n - 1) * (a + size / (n * b)) if ring else logn * (a + size / (2 * b))
    if op in ("broadcast", "reduce"):
        return (n - 1) * (a + size / b) if ring else logn * (a + size / b)
    if op == "barrier":
        return 2 * (n - 1) * a if ring else 2 * logn * a
    return 0.0


@dataclasses.dataclass
class Usage:
    """One rank's totals, and per op: collectives entered, bytes sent and received."""

    collectives: int = 0
    sent: float = 0.0
    received: float = 0.0
    ops: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # op -> [count, sent, recv]


def usage(traces: Mapping[int, Sequence[Collective]]) -> dict[int, Usage]:
    """Each rank's :class:`Usage` from its trace."""
    out: dict[int, Usage] = {}
    for r, events in traces.items():
        u = out[r] = Usage()
        for c in events:
            t = traffic(c, r)
            u.collectives += 1
            u.sent += t.sent
            u.received += t.received
            row = u.ops.setdefault(c.op, [0, 0.0, 0.0])
            row[0] += 1
            row[1] += t.sent
            row[2] += t.received
    return out


def _b(x: float) -> str:
    return (
        f"{x:,.0f} B" if x < 10_000 else f"{x / 1024:,.1f} KiB" if x < 10_000_000 else f"{x / 2**20:,.1f} MiB"
    )


def _t(s: float) -> str:
    return f"{s * 1e6:.4g} us" if s < 1e-3 else f"{s * 1e3:.4g} ms"


def format_comm(traces: Mapping[int, Sequence[Collective]], model: CostModel | None = None) -> str:
    """The accounting table per rank and per op, then every collective with its estimate."""
    model = model or CostModel()
    algos = ("ring", "tree") if model.algorithm == "both" else (model.algorithm,)
    lines = [f"{'rank':>4}  {'op':<28} {'count':>5} {'sent':>12} {'received':>12}"]
    for r, u in sorted(usage(traces).items()):
        for op, (count, sent, recv) in sorted(u.ops.items()):
            lines.append(f"{r:>4}  {op:<28} {count:>5} {_b(sent):>12} {_b(recv):>12}")
        lines.append(f"{r:>4}  {'total':<28} {u.collectives:>5} {_b(u.sent):>12} {_b(u.received):>12}")
    lines.append(
        f"alpha-beta estimate per collective (alpha {model.alpha * 1e6:g} us, beta {model.beta / 1e9:g} GB/s; "
        f"S = the collective's size):"
    )
    for r, c in _each_once(traces):
        t = traffic(c, r)
        est = ", ".join(f"{a} {_t(estimate(c.op, t.group_size, t.size, a, model))}" for a in algos)
        where = f"to rank {c.peer}" if c.op == "send" else f"on group {list(c.group)}"
        lines.append(f"  rank {r} {c.signature()} {where}: S = {_b(t.size)}; {est}")
    per_rank = {  # a rank's collectives run one after another; ranks in parallel: the slowest
        a: max((sum(_seconds(c, r, a, model) for c in t) for r, t in traces.items()), default=0.0)
        for a in algos
    }
    lines.append(
        "  the slowest rank's collectives in sequence: "
        + ", ".join(f"{a} {_t(v)}" for a, v in per_rank.items())
    )
    unseen = unseen_backward_note(traces)
    if unseen:
        lines.append(unseen)
    return "\n".join(lines)


#: functional collectives whose autograd kernel issues a collective of its own in backward, from
#: C++, where the trace does not see it (torch 2.13: the ``_autograd`` variants, and all_reduce)
FUNCTIONAL_WITH_BACKWARD = ("all_reduce",)


def unseen_backward_note(traces: Mapping[int, Sequence[Collective]]) -> str | None:
    """A line for the functional collectives entered whose backward collectives (issued by C++ where
    the input requires grad) are neither traced nor counted: a new user's sequence-parallel MLP
    entered 5 collectives a rank, ``--comm`` listed 3, and nothing said why."""
    calls = collections.Counter(
        c.call
        for events in traces.values()
        for c in events
        if c.api == "functional" and (c.call.endswith("_autograd") or c.call in FUNCTIONAL_WITH_BACKWARD)
    )
    if not calls:
        return None
    said = ", ".join(f"{name} x{n}" for name, n in sorted(calls.items()))
    return (
        f"not counted: the backward collectives of functional collectives with an autograd kernel "
        f"({said}, over all ranks), which C++ issues where their input requires grad, out of the "
        "trace's sight (docs/how-to/communication-budgets.md)"
    )


def _seconds(c: Collective, rank: int, algorithm: str, model: CostModel) -> float:
    if c.op == "recv":  # its send is counted on the sender
        return 0.0
    t = traffic(c, rank)
    return estimate(c.op, t.group_size, t.size, algorithm, model)


def _each_once(traces: Mapping[int, Sequence[Collective]]) -> list[tuple[int, Collective]]:
    """Every collective once: a group's from its lowest traced member, a send from its sender."""
    out = []
    for r, events in sorted(traces.items()):
        for c in events:
            if c.op == "recv":
                continue
            if c.op != "send" and min((m for m in c.group if m in traces), default=r) != r:
                continue
            out.append((r, c))
    return out


def budget_violation(budget: CommBudget, traces: Mapping[int, Sequence[Collective]]) -> str | None:
    """What exceeds ``budget`` on which rank, or None."""
    problems = []
    for r, u in sorted(usage(traces).items()):
        if budget.sent is not None and u.sent > budget.sent + 1e-6:
            problems.append(
                f"rank {r} sent {_b(u.sent)}, over the budget of {_b(budget.sent)} ({u.sent / max(budget.sent, 1):.3g}x)"
            )
        if budget.collectives is not None and u.collectives > budget.collectives:
            problems.append(
                f"rank {r} entered {u.collectives} collectives, over the budget of {budget.collectives}"
            )
    if budget.largest is not None:
        for r, events in sorted(traces.items()):
            big = max(events, key=lambda c: traffic(c, r).size, default=None)
            if big is not None and traffic(big, r).size > budget.largest + 1e-6:
                problems.append(
                    f"rank {r} entered {big.signature()} of S = {_b(traffic(big, r).size)}, over the "
                    f"largest single collective allowed, {_b(budget.largest)}"
                )
    return "; ".join(problems) if problems else None


def over_budget(target: Any, impl_name: str, case: Any, traces: Traces) -> tuple[CommBudget, str] | None:
    """The budget and what exceeds it, where the implementation declared one and sent more."""
    fn = budget_for(target, impl_name)
    if fn is None:
        return None
    try:
        budget = fn(case)
    except Exception as e:
        raise TargetCodeError.of(target.name, f"comm[{impl_name!r}](case)", case, e) from e
    problem = budget_violation(budget, traces)
    return None if problem is None else (budget, problem)
