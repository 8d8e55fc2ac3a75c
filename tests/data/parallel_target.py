"""Every collective helper of :mod:`shardfuzz.spec.parallel`, fed inputs of any strides.

Rank ``r`` holds ``(r + 1) * x`` (and ``(r + 1) * y`` for the sequence helpers), laid out as
``options["layouts"][r]`` says: row-major, transposed, a strided slice of a bigger buffer, at a
storage offset, or expanded (a stride of 0: only when ``broadcast``, which makes every row of the
inputs equal). Ranks with different layouts hold the same values in differently ordered memory:
a helper that reduces raw memory gets the wrong sums. The oracle needs no collective.
"""

from types import SimpleNamespace

import torch
from hypothesis import strategies as st

import shardfuzz.strategies as sst
from shardfuzz import Replicate, Shard, Target
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets, split_sizes
from shardfuzz.spec.parallel import (
    AllToAll,
    CopyToGroup,
    GatherSequence,
    ReduceFromGroup,
    ReduceScatterSequence,
    all_gather_by_all_to_all,
    all_reduce_by_all_to_all,
    gather_shards,
    reduce_scatter_by_all_to_all,
    reduce_scatter_shards,
)

DENSE = ("rowmajor", "transposed", "sliced", "offset")
ROWS_PER_RANK = 2  # x has world * ROWS_PER_RANK rows: equal all-to-all chunks


def layouts():
    dense = st.lists(st.sampled_from(DENSE), min_size=3, max_size=3).map(lambda v: [False, *v])
    any_ = st.lists(st.sampled_from((*DENSE, "expanded")), min_size=3, max_size=3).map(lambda v: [True, *v])
    return st.one_of(dense, any_)


def cases(world_sizes=None):
    return sst.cases(
        "parallel_helpers",
        sizes={"s": sst.Split(min_per_rank=0, max_per_rank=2, allow_empty=True)},
        options={"layouts": layouts()},
        world_sizes=world_sizes,
        min_world=1,
        max_world=3,
        max_dims=1,
        dtypes=("float64",),
        profiles=("normal",),
    )


def inputs(case):
    gen = generator(case)
    w = case.world_size
    x, y = randn(case, w * ROWS_PER_RANK, 3, gen=gen), randn(case, 2, case.sizes["s"], 3, gen=gen)
    if case.options["layouts"][0]:  # broadcast: every row equal, so an expanded view holds them
        x, y = x[:1].expand_as(x).contiguous(), y[:1].expand_as(y).contiguous()
    return {"x": x, "y": y}


def lay_out(v, layout):
    """``v``'s values in ``layout``'s memory order."""
    if layout == "transposed":
        return v.transpose(0, -1).contiguous().transpose(0, -1)
    if layout == "sliced":
        buf = torch.zeros(*v.shape[:-1], 2 * v.shape[-1], dtype=v.dtype)
        buf[..., ::2] = v
        return buf[..., ::2]
    if layout == "offset":
        buf = torch.zeros(1 + v.numel(), dtype=v.dtype)
        buf[1:] = v.reshape(-1)
        return buf[1:].view(v.shape)
    if layout == "expanded":
        return v[:1].expand_as(v)
    assert layout == "rowmajor", layout
    return v.contiguous()


def _shard(v, rank, size, dim):
    off, n = split_offsets(v.shape[dim], size)[rank], split_sizes(v.shape[dim], size)[rank]
    return v.narrow(dim, off, n)


def reference(ctx):
    g, r, w = ctx.group, ctx.group_rank, ctx.group_size
    layout = ctx.case.options["layouts"][1 + r]
    x, y = ctx.inputs["x"] * (r + 1), ctx.inputs["y"] * (r + 1)
    mine = lay_out(x, layout)
    splits = [ROWS_PER_RANK] * w
    seq = y.shape[1]
    y_shard = lay_out(_shard(y, r, w, 1), layout)
    rows = y.transpose(0, 1)  # [s, 2, 3]: the split size first
    # its rows differ (broadcast makes y's dim 0 equal, not this one): no expanded view of them
    rows_layout = "transposed" if layout == "expanded" else layout
    return {
        "sum": ReduceFromGroup.apply(mine, g),
        "sum_copy_backward": CopyToGroup.backward(SimpleNamespace(group=g, reduce_backward=True), mine)[0],
        "sum_by_all_to_all": all_reduce_by_all_to_all(mine, g, w),
        "gathered_by_all_to_all": all_gather_by_all_to_all(mine, g, w),
        "scattered_by_all_to_all": reduce_scatter_by_all_to_all(mine, g, w),
        "all_to_all": AllToAll.apply(mine, splits, splits, g),
        "all_to_all_backward": AllToAll.backward(
            SimpleNamespace(splits=(splits, splits), group=g, grad_dtype=None), mine
        )[0],
        "gather_seq": GatherSequence.apply(y_shard, g, seq),
        "gather_seq_backward": ReduceScatterSequence.backward(
            SimpleNamespace(seq_len=seq, group=g, dim=1), y_shard
        )[0],
        "scatter_seq": ReduceScatterSequence.apply(lay_out(y, layout), g),
        "scatter_seq_backward": GatherSequence.backward(
            SimpleNamespace(group=g, reduce_backward=True, dim=1), lay_out(y, layout)
        )[0],
        # the same over dim 0 (a batch), through the autograd wrappers
        "gather_rows": gather_shards(lay_out(_shard(rows, r, w, 0), rows_layout), g, seq, dim=0),
        "scatter_rows": reduce_scatter_shards(lay_out(rows, rows_layout), g, dim=0),
        "gather_rows_backward": ReduceScatterSequence.backward(
            SimpleNamespace(seq_len=seq, group=g, dim=0), lay_out(_shard(rows, r, w, 0), rows_layout)
        )[0],
        "scatter_rows_backward": GatherSequence.backward(
            SimpleNamespace(group=g, reduce_backward=True, dim=0), lay_out(rows, rows_layout)
        )[0],
    }


def oracle(inp, case):
    x, y, w = inp["x"], inp["y"], case.world_size
    total = w * (w + 1) / 2
    own = [r + 1 for r in range(w)]  # rank r holds (r + 1) * x
    chunks = x.reshape(w, ROWS_PER_RANK, 3)
    a2a = torch.cat([chunks[i] * k for i in range(w) for k in own])  # rank i: chunk i of every rank
    gathered_y = torch.cat([_shard(y, r, w, 1) * k for r, k in enumerate(own)], dim=1)
    return {
        "sum": x * total,
        "sum_copy_backward": x * total,
        "sum_by_all_to_all": x * total,
        "gathered_by_all_to_all": torch.cat([(x * k).reshape(-1) for k in own]),
        "scattered_by_all_to_all": x.reshape(-1) * total,
        "all_to_all": a2a,
        "all_to_all_backward": a2a,
        "gather_seq": gathered_y,
        "gather_seq_backward": gathered_y,
        "scatter_seq": y * total,
        "scatter_seq_backward": y * total,
        "gather_rows": gathered_y.transpose(0, 1),
        "scatter_rows": y.transpose(0, 1) * total,
        "gather_rows_backward": gathered_y.transpose(0, 1),
        "scatter_rows_backward": y.transpose(0, 1) * total,
    }


def magnitude(inp, case):
    return {k: v.abs() for k, v in oracle({k: t.abs() for k, t in inp.items()}, case).items()}


def cloning(ctx):
    """The helpers as they were before issue 24: a copy that keeps the input's strides."""
    import shardfuzz.spec.parallel as parallel

    original = parallel.dense_copy
    parallel.dense_copy = lambda t: t.clone()
    try:
        return reference(ctx)
    finally:
        parallel.dense_copy = original


REPLICATED = (
    "sum",
    "sum_copy_backward",
    "sum_by_all_to_all",
    "gathered_by_all_to_all",
    "gather_seq",
    "gather_rows",
)
PARALLEL = Target(
    name="parallel_helpers",
    description="shardfuzz.spec.parallel's collective helpers over inputs of any strides",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    magnitude=magnitude,
    outputs={
        **{k: Replicate() for k in (*REPLICATED, "gather_seq_backward")},
        "scattered_by_all_to_all": Shard(0),
        "all_to_all": Shard(0),
        "all_to_all_backward": Shard(0),
        "scatter_seq": Shard(1),
        "scatter_seq_backward": Shard(1),
        "scatter_rows": Shard(0),
        "gather_rows_backward": Replicate(),
        "scatter_rows_backward": Shard(0),
    },
    implementations={"reference": "reference", "cloning": "cloning"},
)
