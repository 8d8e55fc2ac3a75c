"""A hand-written ring all-reduce (the handbook's): a reduce-scatter then an all-gather, each
``n - 1`` steps of ``S / n`` sent to the next rank. The trace's byte count must be ``2 (n-1)/n * S``
per rank."""

import torch
import torch.distributed as dist

import shardfuzz.strategies as sst
from shardfuzz import CommBudget, Replicate, Target
from shardfuzz.comm import all_reduce_bytes
from shardfuzz.inputs import generator, randn


def inputs(case):
    n = case.sizes["rows"] * case.group_size  # every rank's own vector: rows per rank x n chunks
    return {"x": randn(case, case.group_size, n, gen=generator(case))}


def oracle(inp, case):
    return {"total": inp["x"].sum(0)}


def ring_all_reduce(ctx):
    n, r = ctx.group_size, ctx.group_rank
    chunks = list(ctx.inputs["x"][r].clone().chunk(n))
    nxt, prv = (r + 1) % n, (r - 1) % n
    for step in range(2 * (n - 1)):  # n - 1 reduce-scatter steps, then n - 1 all-gather steps
        send_i, recv_i = (r - step) % n, (r - step - 1) % n
        got = torch.empty_like(chunks[recv_i])
        ops = [
            dist.P2POp(dist.isend, chunks[send_i].contiguous(), group=ctx.group, group_peer=nxt),
            dist.P2POp(dist.irecv, got, group=ctx.group, group_peer=prv),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        chunks[recv_i] = chunks[recv_i] + got if step < n - 1 else got
    return {"total": torch.cat(chunks)}


def budget(case):
    numel = case.sizes["rows"] * case.group_size
    return CommBudget(sent=all_reduce_bytes(numel, case.group_size, case.dtype), why="2 (n-1)/n * S")


TARGET = Target(
    name="ring_allreduce",
    cases=lambda world_sizes=None: sst.cases(
        "ring_allreduce", sizes={"rows": sst.Free(1, 3)}, world_sizes=world_sizes
    ),
    inputs=inputs,
    oracle=oracle,
    outputs={"total": Replicate()},
    implementations={"reference": "ring_all_reduce"},
    comm={"reference": budget},
)
