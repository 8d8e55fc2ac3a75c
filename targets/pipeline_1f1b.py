"""A pipeline of ``P`` stages over ``M`` micro-batches, GPipe or 1F1B, with the schedule as data.

The model is ``layers`` layers ``x -> gelu(x @ W_l^T + b_l)`` of width ``hidden``; the group is the
pipeline (``P`` = the group size, 1-4) and the layers are cut into ``P`` stages by
``tensor_split``'s rule (``layers`` is a split size: uneven stages happen, empty ones never). The
batch is ``M`` micro-batches of ``rows`` rows each (``M`` drawn 1-6, so ``M < P`` is common); the
loss, on the last stage, is the mean squared error against a target ``t`` over the whole batch:
each micro-batch's mean divided by ``M`` (equal micro-batches, so that is the batch mean). The
oracle is the same model on the whole batch in one process.

Outputs: ``acts`` (``[P, M * rows, hidden]``, ``Shard(0)``: stage ``s`` returns its own output
activations for the whole batch), ``grad_w`` / ``grad_b`` (``Shard(0, rule="tensor_split")``
over layers: each stage its own layers' gradients), ``loss`` (``Owned()``: the last stage holds
it) and ``bubble``.

The schedule is data. Each stage runs :func:`stage_steps` (its sequence of ``("F", mb)`` and
``("B", mb)``) and records what it ran; at the end the stages all-gather their recorded orders
(one ``all_gather_into_tensor`` of ``2 M + 1`` integers) and every stage judges them the same way:
:func:`order_problem` checks each stage's order against the kind (each step once, forwards and
backwards in micro-batch order; GPipe all forwards first; 1F1B ``min(P - s - 1, M)`` warm-up
forwards, then one forward and one backward alternately, then the backwards left) and
:func:`simulate` runs them on a unit clock (each step one slot, a forward after the previous
stage's forward of that micro-batch, a backward after the next stage's backward of it and its own
forward): the idle slots, never wall time. ``bubble = [order valid, idle slots, slots]``, compared
exactly against the formula: ``[1, 2 P (P - 1), 2 (M + P - 1)]``, a bubble fraction of
``(P - 1) / (M + P - 1)`` for both kinds in this unit model. A wrong order or bubble count is a
``mismatch`` on ``bubble``.

Activations and gradients travel with ``dist.isend`` (never waited until the end: a valid
schedule cannot then deadlock, whatever gloo buffers) and a waited ``dist.irecv``. torch's
``torch.distributed.pipelining`` is an implementation too (``targets/pipeline_1f1b_torch.py``).
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz.strategies as sst
from shardfuzz import CommBudget, Expect, Owned, PlantedBug, Replicate, Shard, Target, Verified
from shardfuzz.spec.budget import ITEMSIZE, all_gather_bytes
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_sizes

KINDS = ("gpipe", "1f1b")
SIZES = {
    "layers": sst.Split(min_per_rank=1, max_per_rank=2),
    "rows": sst.Free(1, 2),  # rows per micro-batch
    "hidden": sst.Free(1, 4),
}
OPTIONS = {"kind": st.sampled_from(KINDS), "microbatches": st.integers(1, 6)}


def cases(world_sizes=None):
    return sst.cases("pipeline_1f1b", sizes=SIZES, options=OPTIONS, world_sizes=world_sizes)


def _batch(case) -> int:
    return case.options["microbatches"] * case.sizes["rows"]


def inputs(case):
    g, h, n = generator(case), case.sizes["hidden"], case.sizes["layers"]
    return {
        "x": randn(case, _batch(case), h, gen=g),
        "t": randn(case, _batch(case), h, gen=g),
        "w": randn(case, n, h, h, gen=g, scale=h**-0.5, role="weight"),
        "b": randn(case, n, h, gen=g, scale=0.5, role="weight"),
    }


def stage_layers(case) -> list[int]:
    """The number of layers on each stage (``tensor_split``'s rule)."""
    return split_sizes(case.sizes["layers"], case.group_size, "tensor_split")


def _layer(x, w, b):
    return F.gelu(x @ w.T + b)


def oracle(inp, case):
    w = inp["w"].clone().requires_grad_(True)
    b = inp["b"].clone().requires_grad_(True)
    x, acts, layer = inp["x"], [], 0
    for k in stage_layers(case):
        for _ in range(k):
            x = _layer(x, w[layer], b[layer])
            layer += 1
        acts.append(x)
    loss = F.mse_loss(x, inp["t"])
    loss.backward()
    p, m = case.group_size, case.options["microbatches"]
    bubble = torch.tensor([1, 2 * p * (p - 1), 2 * (m + p - 1)])
    return {
        "acts": torch.stack(acts).detach(),
        "grad_w": w.grad,
        "grad_b": b.grad,
        "loss": loss.detach(),
        "bubble": bubble,
    }


# -- the schedule as data ---------------------------------------------------------------------------
def stage_steps(kind: str, p: int, m: int, s: int, bug: str | None = None) -> list[tuple[str, int]]:
    """What stage ``s`` of ``p`` runs over ``m`` micro-batches under ``kind``."""
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = p - s - 1
    if bug == "warmup_p":
        warm = p
    if bug != "warmup_unclamped":
        warm = min(warm, m)
    steps = [("F", i) for i in range(warm)]
    for i in range(m - warm):  # steady state: one forward, one backward
        steps += [("F", warm + i), ("B", i)]
    return steps + [("B", i) for i in range(max(m - warm, 0), m)]


def order_problem(kind: str, m: int, orders: list[list[tuple[str, int]]]) -> str | None:
    """Why the recorded ``orders`` (one per stage) are not a ``kind`` schedule, or None."""
    p = len(orders)
    for s, order in enumerate(orders):
        if sorted(order) != sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)]):
            return f"stage {s} did not run each forward and backward once: {order}"
        for k in "FB":
            if [i for kk, i in order if kk == k] != list(range(m)):
                return f"stage {s}: {k} steps out of micro-batch order: {order}"
        kinds = "".join(k for k, _ in order)
        if kind == "gpipe" and kinds != "F" * m + "B" * m:
            return f"stage {s}: GPipe runs every forward before any backward: {kinds}"
        if kind == "1f1b":
            warm = min(p - s - 1, m)
            want = "F" * warm + "FB" * (m - warm) + "B" * warm
            if kinds != want:
                return f"stage {s}: 1F1B with {warm} warm-up forwards runs {want}, not {kinds}"
    return None


def simulate(orders: list[list[tuple[str, int]]]) -> tuple[int, int] | None:
    """Run the stages' orders on a unit clock: (idle slots over all stages, makespan), or None when
    they deadlock. A step takes one slot; ``F mb`` on stage ``s`` waits for ``F mb`` on ``s - 1``,
    ``B mb`` for ``B mb`` on ``s + 1`` (the last stage's for its own ``F mb``)."""
    p = len(orders)
    done: dict[tuple[int, str, int], int] = {}  # (stage, kind, mb) -> slot it finishes
    nxt, free = [0] * p, [0] * p
    while any(nxt[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            if nxt[s] == len(orders[s]):
                continue
            k, mb = orders[s][nxt[s]]
            deps = [(s - 1, "F", mb)] if k == "F" and s > 0 else []
            if k == "B":
                deps = [(s, "F", mb)] + ([(s + 1, "B", mb)] if s < p - 1 else [])
            if all(d in done for d in deps):
                start = max([free[s]] + [done[d] for d in deps])
                done[(s, k, mb)] = free[s] = start + 1
                nxt[s] += 1
                moved = True
        if not moved:
            return None
    span = max(free)
    return sum(span - len(o) for o in orders), span


def _encode(order: list[tuple[str, int]], m: int) -> torch.Tensor:
    codes = [i + 1 if k == "F" else -(i + 1) for k, i in order][: 2 * m]
    return torch.tensor([len(order), *codes, *[0] * (2 * m - len(codes))], dtype=torch.int64)


def _decode(row: torch.Tensor) -> list[tuple[str, int]]:
    n, codes = int(row[0]), row[1:].tolist()
    return [("F", c - 1) if c > 0 else ("B", -c - 1) for c in codes[:n] if c != 0]


def judge_orders(ctx, order: list[tuple[str, int]]) -> torch.Tensor:
    """All-gather every stage's recorded order and judge it: ``[valid, idle slots, slots]``."""
    m = ctx.case.options["microbatches"]
    mine = _encode(order, m)
    rows = torch.empty(ctx.group_size * mine.numel(), dtype=torch.int64)
    dist.all_gather_into_tensor(rows, mine, group=ctx.group)
    orders = [_decode(r) for r in rows.view(ctx.group_size, -1)]
    problem = order_problem(ctx.case.options["kind"], m, orders)
    clock = simulate(orders)
    idle, span = clock if clock is not None else (-1, -1)
    return torch.tensor([int(problem is None and clock is not None), idle, span])


# -- the reference ----------------------------------------------------------------------------------
def reference(ctx, *, bug: str | None = None):
    """Stage ``group_rank`` of the pipeline; ``bug`` plants one of the ``PLANTED`` bugs."""
    case, inp = ctx.case, ctx.inputs
    p, s, m, rows = ctx.group_size, ctx.group_rank, case.options["microbatches"], case.sizes["rows"]
    counts = stage_layers(case)
    first = sum(counts[:s])
    w = inp["w"][first : first + counts[s]].clone().requires_grad_(True)
    b = inp["b"][first : first + counts[s]].clone().requires_grad_(True)
    h = inp["x"].shape[1]
    ins: dict[int, torch.Tensor] = {}
    outs: dict[int, torch.Tensor] = {}
    losses: list[torch.Tensor] = []
    sends: list = []
    latest = None
    order: list[tuple[str, int]] = []

    def recv(peer):
        buf = torch.empty(rows, h, dtype=inp["x"].dtype)
        dist.irecv(buf, group=ctx.group, group_src=peer).wait()
        return buf

    def send(t, peer):
        t = t.detach().contiguous()
        sends.append((t, dist.isend(t, group=ctx.group, group_dst=peer)))

    scale = 1 if bug == "loss_not_divided_by_m" else m  # each micro-batch's loss over M: the mean
    xs, ts = inp["x"].split(rows), inp["t"].split(rows)  # the micro-batches
    for k, mb in stage_steps(case.options["kind"], p, m, s, bug):
        order.append((k, mb))
        if k == "F":
            x = xs[mb] if s == 0 else recv(s - 1)
            x = x.detach().requires_grad_(s > 0)
            y = x
            for j in range(counts[s]):
                y = _layer(y, w[j], b[j])
            ins[mb], outs[mb], latest = x, y, y
            if s < p - 1:
                send(y, s + 1)
            else:
                losses.append(F.mse_loss(y.detach(), ts[mb]) / scale)
            continue
        if s == p - 1:  # the gradient of this micro-batch's loss at its output
            y = (latest if bug == "stale_activation" else outs[mb]).detach().requires_grad_(True)
            (F.mse_loss(y, ts[mb]) / scale).backward()
            grad = y.grad
        else:
            grad = recv(s + 1)
        outs[mb].backward(grad)
        if s > 0:
            send(ins[mb].grad, (s + 1) % p if bug == "grad_to_next_stage" else s - 1)
    for _, work in sends:
        work.wait()
    loss = torch.stack(losses).sum() if s == p - 1 else torch.zeros(0, dtype=inp["x"].dtype)
    if bug == "logged_loss_broadcast":  # every stage gets the loss to log it: one collective more
        logged = loss.clone() if s == p - 1 else torch.zeros((), dtype=loss.dtype)
        dist.broadcast(logged, group=ctx.group, group_src=p - 1)
    return {
        "acts": torch.cat([outs[i].detach() for i in range(m)]).unsqueeze(0),
        "grad_w": w.grad,
        "grad_b": b.grad,
        "loss": loss,
        "bubble": judge_orders(ctx, order),
    }


def reference_comm(case) -> CommBudget:
    """Per micro-batch a stage sends its output forward and its input gradient back (a middle
    stage both, an end one, none on 1 stage), each op a send and a receive, plus the orders'
    all-gather of ``2 M + 1`` integers per stage."""
    p, m = case.group_size, case.options["microbatches"]
    neighbours = min(p - 1, 2)
    act = case.sizes["rows"] * case.sizes["hidden"] * ITEMSIZE[case.dtype]
    gather = all_gather_bytes(p * (2 * m + 1), p, "int64")
    why = "M activations and M gradients per neighbour, plus the orders' all-gather"
    return CommBudget(sent=neighbours * m * act + gather, collectives=2 * neighbours * m + 1, why=why)


def outputs(case):
    return {
        "acts": Shard(0),
        "grad_w": Shard(0, rule="tensor_split"),
        "grad_b": Shard(0, rule="tensor_split"),
        "loss": Owned(),
        "bubble": Replicate(),
    }


def _m(c) -> int:
    return c.options["microbatches"]


TRIGGERS = {
    "GPipe": lambda c: c.options["kind"] == "gpipe",
    "1F1B": lambda c: c.options["kind"] == "1f1b",
    "M=1": lambda c: _m(c) == 1,
    "M>=2": lambda c: _m(c) >= 2,
    "M<P": lambda c: _m(c) < c.group_size,
    "M<P-1": lambda c: _m(c) < c.group_size - 1,
    "M>P": lambda c: _m(c) > c.group_size,
    "P=4": lambda c: c.group_size == 4,
    "P>=3": lambda c: c.group_size >= 3,
    "a stage with 2+ layers": lambda c: max(stage_layers(c)) >= 2,
}

PLANTED = [
    PlantedBug(
        "loss_not_divided_by_m",
        "each micro-batch's loss is its own mean, not divided by the number of micro-batches, so "
        "the loss and every gradient are M times the whole batch's (right on 1 micro-batch)",
        Expect(
            kind="mismatch",
            world_size=1,
            mesh=None,
            uneven=None,
            check=lambda c: _m(c) == 2,
            note="2 micro-batches",
        ),
        p95=2,
        link="pytorch/torchtitan#2972",
    ),
    PlantedBug(
        "warmup_p",
        "1F1B warm-up of P forwards instead of P - rank - 1: every stage runs one forward more "
        "before its first backward (values right; the order is not 1F1B's, more activations live "
        "at once, and on a blocking transport the stages deadlock)",
        Expect(
            kind="mismatch",
            world_size=1,
            mesh=None,
            uneven=None,
            outputs=("bubble",),
            check=lambda c: _m(c) == 2,
            note="1F1B, 2 micro-batches",
            needs=("1F1B", "M>=2"),
        ),
        p95=2,
        link="NVIDIA/Megatron-LM#169",
    ),
    PlantedBug(
        "stale_activation",
        "the last stage takes the loss gradient at its latest output, not at the micro-batch being "
        "backwarded: right under 1F1B (the last stage alternates F and B of the same micro-batch), "
        "stale under GPipe with 2+ micro-batches",
        Expect(
            kind="mismatch",
            world_size=1,
            mesh=None,
            uneven=None,
            outputs=("grad_w", "grad_b"),
            check=lambda c: _m(c) == 2,
            note="GPipe, 2 micro-batches",
            needs=("GPipe", "M>=2"),
        ),
        p95=4,
    ),
    PlantedBug(
        "grad_to_next_stage",
        "input gradients sent to the ring's next stage (s + 1) % P instead of s - 1: the same peer "
        "on 2 stages, on 3 or more the previous stage waits for a gradient that went elsewhere",
        Expect(kind="hang", world_size=3, mesh=(3,), uneven=None, timeout=2.0, note="3 stages"),
        p95=1,
        link="NVIDIA/Megatron-LM#1450",
    ),
    PlantedBug(
        "warmup_unclamped",
        "1F1B warm-up P - rank - 1 not clamped to M: with fewer micro-batches than the warm-up, the "
        "first stage asks for micro-batches that do not exist (IndexError)",
        Expect(
            kind="rank-error",
            world_size=3,
            mesh=(3,),
            uneven=None,
            check=lambda c: _m(c) == 1,
            note="1F1B, 1 micro-batch",
            needs=("1F1B", "M<P-1"),
        ),
        p95=6,
        link="AMD-AGI/Primus#1003",
    ),
    PlantedBug(
        "logged_loss_broadcast",
        "the last stage broadcasts the loss to every stage for logging: right values, one "
        "collective more than the pipeline needs",
        Expect(kind="communication", world_size=1, mesh=None, uneven=None, note="1 stage, any case"),
        p95=1,
    ),
]

#: torch.distributed.pipelining (targets/pipeline_1f1b_torch.py)
TORCH = "shardfuzz.targets.pipeline_1f1b_torch:torch_pipeline"

# torch.distributed.pipelining: tests/test_verified.py runs it
VERIFIED = [
    Verified(
        name="torch_pipeline",
        what="torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B; 1F1B with fewer "
        "micro-batches than stages is refused",
        examples=20,
        reaches=("GPipe", "1F1B", "M>P", "P>=3"),
        refuses=("1F1B with M < P",),
    ),
]

TARGET = Target(
    name="pipeline_1f1b",
    description="a P-stage pipeline over M micro-batches, GPipe or 1F1B over isend/irecv: stage "
    "activations, gradients, loss, and the recorded schedule's order and bubble (P-1)/(M+P-1)",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs=outputs(None),
    implementations={"reference": "reference", "torch_pipeline": TORCH},
    planted=PLANTED,
    verified=VERIFIED,
    triggers=TRIGGERS,
    gradients=("grad_w", "grad_b"),
    comm={"reference": reference_comm},
)
