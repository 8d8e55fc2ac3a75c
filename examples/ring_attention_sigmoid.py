"""Ring attention, forward only, with the sigmoid-form LSE merge of PyTorch's context parallel.

``q``, ``k``, ``v`` (``[batch, seq, heads, head_dim]``) are sharded on the sequence (``Shard(1)``,
DTensor's rule: uneven lengths, and a rank may hold no tokens). For ``W`` steps each rank attends
its queries to the K/V block it holds (one softmax block: ``out_b``, ``lse_b``), merges it into its
running result as ``torch.distributed.tensor.experimental._attention`` does,

    out = out - sigmoid(lse_b - lse) * (out - out_b)
    lse = lse - logsigmoid(lse - lse_b)

and passes the K/V block to the next rank (``batch_isend_irecv``; blocks padded to the longest).
The block math runs in float32 (float64 stays float64); ``out`` is cast back to the case dtype and
``lse`` (``[batch, heads, seq]``, ``Shard(2)``) stays in the math precision.

Option ``causal``: the block a rank starts with is masked by global positions, blocks from
earlier ranks are attended in full, blocks from later ranks are skipped.

Planted bugs: ``naive_merge`` (ring-flash-attention before 9b84a6a: ``log(1 + exp(lse_b - lse))``
overflows for logit gaps above ~88 in float32, ~709 in float64: the ``large`` profile) and
``causal_every_step`` (the causal mask applied to every block, not only the diagonal one: wrong
when causal on 2 ranks or more).
"""

import hypothesis.strategies as st
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets, split_sizes


def inputs(case):
    b, s, h, d = (case.sizes[k] for k in ("batch", "seq", "heads", "head_dim"))
    g = generator(case)
    return {name: randn(case, b, s, h, d, gen=g) for name in ("q", "k", "v")}


def stat_dtype(dtype):
    return torch.promote_types(dtype, torch.float32)


def oracle(inp, case):
    q, k, v = inp["q"], inp["k"], inp["v"]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if case.options["causal"]:
        n = q.shape[1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)
    return {"out": out, "lse": torch.logsumexp(s, dim=-1).to(stat_dtype(q.dtype))}


def pass_on(t, group):
    """Send ``t`` to the next rank of the ring, receive the previous rank's."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    recv = torch.empty_like(t)
    ops = [
        dist.P2POp(dist.isend, t, group=group, group_peer=(rank + 1) % size),
        dist.P2POp(dist.irecv, recv, group=group, group_peer=(rank - 1) % size),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return recv


def to_out(t):
    """``[b, h, q]`` -> ``[b, q, h, 1]``, to scale an output ``[b, q, h, d]``."""
    return t.transpose(1, 2).unsqueeze(-1)


def merge(out, lse, block_out, block_lse, naive=False):
    """Merge a block's result into the running one (``out``: [b, q, h, d], ``lse``: [b, h, q])."""
    if naive:
        new = lse + torch.log(1 + torch.exp(block_lse - lse))
        return torch.exp(to_out(lse - new)) * out + torch.exp(to_out(block_lse - new)) * block_out, new
    out = out - torch.sigmoid(to_out(block_lse - lse)) * (out - block_out)
    return out, lse - F.logsigmoid(lse - block_lse)


def ring_attention(ctx, *, naive_merge=False, causal_every_step=False):
    group, rank, size = ctx.group, ctx.group_rank, ctx.group_size
    n, causal = ctx.inputs["q"].shape[1], ctx.case.options["causal"]
    lens, offsets = split_sizes(n, size), split_offsets(n, size)
    dtype = ctx.local["q"].dtype
    q, k, v = (ctx.local[name].to(stat_dtype(dtype)) for name in ("q", "k", "v"))
    b, nq, h, d = q.shape
    kv = F.pad(torch.stack([k, v]), (0, 0, 0, 0, 0, max(lens) - k.shape[1]))  # [2, b, max_len, h, d]
    out = torch.zeros_like(q)
    lse = q.new_full((b, h, nq), -torch.inf)
    first = True
    for step in range(size):
        if step:
            kv = pass_on(kv, group)
        src = (rank - step) % size  # the rank whose K/V block this is
        if nq == 0 or lens[src] == 0 or (causal and src > rank):
            continue
        kb, vb = kv[0, :, : lens[src]], kv[1, :, : lens[src]]
        s = torch.einsum("bqhd,bkhd->bhqk", q, kb) * d**-0.5
        if causal and (src == rank or causal_every_step):
            qpos, kpos = torch.arange(nq), torch.arange(lens[src])
            if not causal_every_step:
                qpos, kpos = qpos + offsets[rank], kpos + offsets[src]
            s = s.masked_fill(kpos[None, :] > qpos[:, None], -torch.inf)
        block_lse = torch.logsumexp(s, dim=-1)
        block_out = torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - block_lse.unsqueeze(-1)), vb)
        if first:
            out, lse, first = block_out, block_lse, False
        else:
            out, lse = merge(out, lse, block_out, block_lse, naive=naive_merge)
    return {"out": out.to(dtype), "lse": lse}


def reference(ctx):
    return ring_attention(ctx)


def naive_merge(ctx):  # planted: exp(lse_b - lse) overflows for large logit gaps
    return ring_attention(ctx, naive_merge=True)


def causal_every_step(ctx):  # planted: off-diagonal blocks masked with local positions
    return ring_attention(ctx, causal_every_step=True)


TARGET = shardfuzz.Target(
    name="ring_attention_sigmoid",
    description="ring attention forward with PyTorch's sigmoid-form LSE merge, causal or not",
    cases=lambda world_sizes=None: sst.cases(
        "ring_attention_sigmoid",
        sizes={
            "batch": sst.Free(1, 2),
            "seq": sst.Split(min_per_rank=1, max_per_rank=3),
            "heads": sst.Free(1, 2),
            "head_dim": sst.Free(1, 4),
        },
        options={"causal": st.booleans()},
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={name: shardfuzz.Shard(1) for name in ("q", "k", "v")},
    outputs={"out": shardfuzz.Shard(1), "lse": shardfuzz.Shard(2)},
    implementations={
        "reference": reference,
        "naive_merge": naive_merge,
        "causal_every_step": causal_every_step,
    },
)
