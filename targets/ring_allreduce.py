"""A hand-written ring all-reduce: a reduce-scatter then an all-gather over ``batch_isend_irecv``.

Each rank of the group holds its own vector of ``numel`` elements (row ``group_rank`` of the input
``x``, ``[group_size, numel]``, drawn from the case seed); every rank must end with the sum of all
of them (the oracle: ``x.sum(0)``, checked on every rank: ``Replicate``). ``numel`` is a split size
with empty shards allowed, so the group rarely divides it and a chunk is often empty.

The vector is cut into ``n`` chunks by the balanced rule (``tensor_split``: sizes ``S // n`` or
one more, the larger first; ``S < n`` leaves the last chunks empty). The reduce-scatter takes
``n - 1`` steps: at step ``s`` rank ``r`` sends its partial sum of chunk ``r - s`` to rank
``r + 1`` and adds what rank ``r - 1`` sends into chunk ``r - s - 1``, so it ends owning the full
sum of chunk ``r + 1``. The all-gather takes ``n - 1`` more steps: at step ``s`` rank ``r``
forwards chunk ``r + 1 - s`` and receives chunk ``r - s``. In bfloat16 (and float16) the partial
sums accumulate in float32 and travel in the case dtype (a correct low-precision ring). Each hop
adds two values, so that rounds as the case dtype's own adds do, once per hop: a ring that
accumulated in bf16 is not a bug the oracle's bound can see, so the planted dtype bug is a bf16
wire for float32 and float64 data (``bf16_wire``).

Bytes: rank ``r`` sends every chunk but ``r + 1`` in the reduce-scatter and every chunk but
``r + 2`` in the all-gather, ``2 S - c[r+1] - c[r+2]`` elements: ``2 (n-1)/n * S`` when ``n``
divides ``S``, and at most ``2 (n-1)/n * S`` of the size padded to a multiple of ``n`` (the
padding rule) otherwise. :func:`ring_elements` is that count; the reference's budget is its largest
value over the ranks, so an oversized message is a ``communication`` finding.

Implementations: ``reference``; ``torch_all_reduce`` (``dist.all_reduce``); ``torch_rs_ag``
(``reduce_scatter_tensor`` then ``all_gather_into_tensor`` on the vector zero-padded to a multiple
of ``n``). Planted bugs: the ``PLANTED`` records at the end of this file.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz.strategies as sst
from shardfuzz import CommBudget, Expect, PlantedBug, Replicate, Target, Verified
from shardfuzz.spec.budget import ITEMSIZE, all_reduce_bytes
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_sizes

#: per rank 0 to 3 elements plus a remainder; 0 per rank: fewer elements than ranks (empty chunks)
SIZES = {"numel": sst.Split(min_per_rank=0, max_per_rank=3, allow_empty=True)}
LOW_PRECISION = (torch.bfloat16, torch.float16)
PROFILES = ("normal", "large", "ties", "edge")


def cases(world_sizes=None):
    # the edge profile too: a value near float16's limit is what a 16-bit wire cannot carry
    return sst.cases("ring_allreduce", sizes=SIZES, world_sizes=world_sizes, profiles=PROFILES)


def inputs(case):
    return {"x": randn(case, case.group_size, case.sizes["numel"], gen=generator(case))}


def oracle(inp, case):
    return {"total": inp["x"].sum(0)}


def chunk_sizes(numel: int, n: int, bug: str | None = None) -> list[int]:
    """The ring's chunk sizes: balanced (``tensor_split``); the chunk-sizing bugs' rules."""
    if bug == "floor_chunks":  # S // n each; the remainder is never sent
        return [numel // n] * n
    if bug == "remainder_on_last":  # S // n each, the last chunk takes the rest
        return [numel // n] * (n - 1) + [numel - (n - 1) * (numel // n)]
    return split_sizes(numel, n, "tensor_split")


def ring_elements(numel: int, n: int) -> list[int]:
    """Elements each rank sends in the ring: every chunk but ``r + 1`` (reduce-scatter) and every
    chunk but ``r + 2`` (all-gather)."""
    if n == 1:
        return [0]
    c = chunk_sizes(numel, n)
    return [2 * numel - c[(r + 1) % n] - c[(r + 2) % n] for r in range(n)]


def _cut(x, sizes, bug):
    if bug == "tensor_chunk":  # Tensor.chunk: ceil-sized pieces, fewer than n when the last are empty
        return list(x.chunk(len(sizes)))
    return list(x[: sum(sizes)].split(sizes))  # floor_chunks leaves the remainder out


def _mod(i: int, n: int, bug: str | None) -> int:
    # the mask equals % n only when n is a power of two (1, 2, 4)
    return i & (n - 1) if bug == "pow2_mask_index" else i % n


def _exchange(ctx, send, recv_shape, dtype, nxt, prv):
    got = torch.empty(recv_shape, dtype=dtype)
    ops = [
        dist.P2POp(dist.isend, send.contiguous(), group=ctx.group, group_peer=nxt),
        dist.P2POp(dist.irecv, got, group=ctx.group, group_peer=prv),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return got


def reference(ctx, *, bug: str | None = None):
    """The ring all-reduce; ``bug`` plants one of the ``PLANTED`` bugs."""
    n, r = ctx.group_size, ctx.group_rank
    x = ctx.inputs["x"][r]
    wire = torch.bfloat16 if bug == "bf16_wire" else x.dtype
    # what the messages hold: the wire dtype; fp16_wire packs any 16-bit data as float16
    msg = torch.float16 if bug == "fp16_wire" and wire == torch.bfloat16 else wire
    # float32 partial sums for low-precision data; the bf16 wire bug accumulates in its wire dtype
    acc_dtype = torch.float32 if wire in LOW_PRECISION and bug != "bf16_wire" else wire
    sizes = chunk_sizes(x.numel(), n, bug)
    acc = [c.to(acc_dtype) for c in _cut(x, sizes, bug)]
    nxt, prv = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):  # reduce-scatter: rank r ends owning chunk r + 1
        send_i, recv_i = _mod(r - step, n, bug), _mod(prv - step, n, bug)
        got = _exchange(ctx, acc[send_i].to(msg), acc[recv_i].shape, msg, nxt, prv)
        acc[recv_i] = acc[recv_i] + got.to(acc_dtype)
    out = [c.to(wire) for c in acc]  # what travels and what is returned: the wire dtype
    shift = 0 if bug == "allgather_off_by_one" else 1
    for step in range(n - 1):  # all-gather: forward the chunk received last
        send_i, recv_i = _mod(r + shift - step, n, bug), _mod(prv + shift - step, n, bug)
        out[recv_i] = _exchange(ctx, out[send_i].to(msg), out[recv_i].shape, msg, nxt, prv).to(wire)
    total = torch.cat(out)
    if bug == "floor_chunks":  # the remainder keeps this rank's own values
        total = torch.cat([total, x[total.numel() :].to(wire)])
    return {"total": total.to(x.dtype)}


def torch_all_reduce(ctx):
    """``dist.all_reduce`` on a copy of this rank's vector."""
    total = ctx.inputs["x"][ctx.group_rank].clone()
    dist.all_reduce(total, group=ctx.group)
    return {"total": total}


def torch_rs_ag(ctx):
    """``reduce_scatter_tensor`` then ``all_gather_into_tensor``, on the vector zero-padded to a
    multiple of the group size (both need equal shards)."""
    n, x = ctx.group_size, ctx.inputs["x"][ctx.group_rank]
    per = -(-x.numel() // n)
    padded = F.pad(x, (0, per * n - x.numel()))
    mine = torch.empty(per, dtype=x.dtype)
    dist.reduce_scatter_tensor(mine, padded, group=ctx.group)
    full = torch.empty(per * n, dtype=x.dtype)
    dist.all_gather_into_tensor(full, mine, group=ctx.group)
    return {"total": full[: x.numel()]}


def reference_comm(case) -> CommBudget:
    """The ring's bytes per rank, exactly: the most any rank sends (:func:`ring_elements`), in
    ``4 (n - 1)`` point-to-point operations (a send and a receive per step)."""
    n, numel = case.group_size, case.sizes["numel"]
    most = max(ring_elements(numel, n)) * ITEMSIZE[case.dtype]
    why = "2 S - c[r+1] - c[r+2] elements (2 (n-1)/n * S when n divides S), balanced chunks"
    return CommBudget(sent=most, collectives=4 * (n - 1), why=why)


def padded_comm(case) -> CommBudget:
    """``torch_rs_ag``: ``2 (n-1)/n`` of the size padded to a multiple of ``n``, in 2 collectives."""
    n = case.group_size
    padded = -(-case.sizes["numel"] // n) * n
    return CommBudget(sent=all_reduce_bytes(padded, n, case.dtype), collectives=2, why="2 (n-1)/n * padded S")


def all_reduce_comm(case) -> CommBudget:
    n = case.group_size
    return CommBudget(
        sent=all_reduce_bytes(case.sizes["numel"], n, case.dtype), collectives=1, why="2 (n-1)/n * S"
    )


def _uneven(c) -> bool:
    return c.sizes["numel"] % c.group_size != 0


TRIGGERS = {
    "an empty chunk": lambda c: c.sizes["numel"] < c.group_size,
    "3+ ranks, uneven size": lambda c: c.group_size >= 3 and _uneven(c),
    "2+ elements in every chunk": lambda c: c.group_size >= 2 and c.sizes["numel"] >= 2 * c.group_size,
    "float32 or float64 data": lambda c: c.dtype != "bfloat16",
}

PLANTED = [
    PlantedBug(
        "remainder_on_last",
        "chunks sized S // n with the remainder piled on the last one, not spread one element each: "
        "right values, but the ranks next to the big chunk send up to n - 1 elements more per phase "
        "(needs 3+ ranks and an uneven size; on 2 ranks each rank sends one chunk per phase)",
        Expect(
            kind="communication",
            world_size=3,
            mesh=(3,),
            uneven=("numel",),
            note="2 elements (chunks [0, 0, 2], not [1, 1, 0])",
            check=lambda c: c.sizes["numel"] == 2,
            needs=("world>=3", "uneven"),
        ),
        p95=4,
    ),
    PlantedBug(
        "allgather_off_by_one",
        "all-gather phase starts one chunk early: each rank forwards a partial sum, not the chunk it "
        "owns, and overwrites the reduced one (an indexing bug in the all-gather step of a "
        "reduce-scatter + all-gather all-reduce)",
        Expect(kind="mismatch", world_size=2, mesh=(2,), uneven=None, note="any size"),
        p95=1,
        link="NVIDIA/FasterTransformer#672",
    ),
    PlantedBug(
        "pow2_mask_index",
        "ring chunk indices taken as i & (n - 1) instead of i % n: the same for 1, 2 and 4 ranks, "
        "on 3 ranks one chunk is never reduced and another twice; on 1 element the sum is right "
        "and only the bytes show it (the only chunk is sent on every step)",
        Expect(
            kind=("communication", "mismatch"),
            world_size=3,
            mesh=(3,),
            uneven=("numel",),
            check=lambda c: c.sizes["numel"] in (1, 2),
            note="1 element (values right, bytes over) or 2 (a chunk never reduced), as met first",
        ),
        p95=1,
        link="meta-pytorch/torchcomms#3214",
    ),
    PlantedBug(
        "floor_chunks",
        "uneven chunks sized with floor division (S // n each): the last S % n elements never go "
        "round the ring and keep each rank's own values (right on even sizes)",
        Expect(kind="mismatch", world_size=2, mesh=(2,), uneven=("numel",)),
        p95=1,
    ),
    PlantedBug(
        "tensor_chunk",
        "chunks cut with Tensor.chunk(n), which returns fewer than n pieces when the last would be "
        "empty (1 element on 2 ranks: one piece): IndexError",
        Expect(
            kind="rank-error",
            world_size=2,
            mesh=(2,),
            uneven=("numel",),
            note="1 element",
            check=lambda c: c.sizes["numel"] == 1,
        ),
        p95=1,
        link="pytorch/pytorch#9382",
    ),
    PlantedBug(
        "bf16_wire",
        "partial sums sent and accumulated in bfloat16 whatever the data's dtype (a bf16 reduce dtype "
        "on float32 gradients): bf16 runs right, float32 and float64 rounded to 8 bits",
        Expect(
            kind="mismatch",
            world_size=1,
            mesh=(1,),
            uneven=None,
            check=lambda c: c.dtype != "bfloat16",
            note="float32 or float64 (the result is cast through the wire dtype on 1 rank too)",
        ),
        p95=2,
        link="pytorch/pytorch#106395",
    ),
    PlantedBug(
        "fp16_wire",
        "bfloat16 messages packed as float16 (a 16-bit wire is a 16-bit wire): exact for most bf16 "
        "values, but bf16 keeps float32's range and float16 stops at 65504, so a value or partial "
        "sum beyond it arrives as inf. Needs bfloat16 data, 2+ ranks (one rank sends nothing) and "
        "a value near float16's limit: the edge profile's max",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,
            check=lambda c: c.dtype == "bfloat16" and c.options.get("edge") == "max",
            note="bfloat16 with an edge value past float16's range",
            needs=("bfloat16", "edge=max"),
        ),
        p95=17,  # budget.py, 20 seeds: a covering row (the 17th) in every schedule
        link="vllm-project/vllm#55346",
    ),
]

# torch's own collectives, within the budgets of their formulas: tests/test_verified.py runs each
VERIFIED = [
    Verified(
        name="torch_all_reduce",
        what="torch.distributed.all_reduce, within 2 (n-1)/n * S bytes a rank",
        examples=20,
        reaches=("an empty chunk", "3+ ranks, uneven size", "2+ elements in every chunk"),
    ),
    Verified(
        name="torch_rs_ag",
        what="reduce_scatter_tensor + all_gather_into_tensor on the vector padded to a multiple of n, "
        "within 2 (n-1)/n of the padded size",
        examples=20,
        reaches=("an empty chunk", "3+ ranks, uneven size", "2+ elements in every chunk"),
    ),
]

TARGET = Target(
    name="ring_allreduce",
    description="hand-written ring all-reduce (reduce-scatter + all-gather over batch_isend_irecv), "
    "uneven and empty chunks, bytes checked against 2 (n-1)/n * S",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs={"total": Replicate()},
    implementations={
        "reference": "reference",
        "torch_all_reduce": "torch_all_reduce",
        "torch_rs_ag": "torch_rs_ag",
    },
    planted=PLANTED,
    verified=VERIFIED,
    triggers=TRIGGERS,
    comm={"reference": reference_comm, "torch_all_reduce": all_reduce_comm, "torch_rs_ag": padded_comm},
)
