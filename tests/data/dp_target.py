"""A target that reduces over the data-parallel axis of a 2-D mesh through ``ctx.mesh.groups[0]``,
as the tutorial's dp x tp section writes it, for tests/test_standalone.py: its standalone script
needs the mesh's per-axis groups."""

import torch.distributed as dist

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn


def inputs(case):
    return {"x": randn(case, case.sizes["rows"], 2, gen=generator(case))}


def oracle(inp, case):
    return {"total": inp["x"].sum(0)}


def _replica_rows(ctx):
    replicas, coord = ctx.world_size // ctx.group_size, ctx.mesh.coords[0] if len(ctx.mesh.shape) > 1 else 0
    return ctx.inputs["x"].tensor_split(replicas)[coord]


def over_dp(ctx):  # each replica sums its rows; the dp group adds the replicas up
    total = _replica_rows(ctx).sum(0)
    if len(ctx.mesh.shape) > 1:
        dist.all_reduce(total, group=ctx.mesh.groups[0])
    return {"total": total}


def averaged_over_dp(ctx):  # bug: the replicas' sums averaged (a mean where a sum was due)
    total = _replica_rows(ctx).sum(0)
    if len(ctx.mesh.shape) > 1:
        dist.all_reduce(total, group=ctx.mesh.groups[0])
        total = total / ctx.mesh.shape[0]
    return {"total": total}


TARGET = shardfuzz.Target(
    name="dp_sum",
    cases=lambda world_sizes=None: sst.cases(
        "dp_sum", sizes={"rows": sst.Free(1, 5)}, world_sizes=world_sizes, mesh_2d_share=1.0
    ),
    inputs=inputs,
    oracle=oracle,
    outputs={"total": shardfuzz.Replicate()},
    implementations={"reference": over_dp, "averaged_over_dp": averaged_over_dp},
)
