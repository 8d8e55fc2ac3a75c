"""Megatron-style sequence parallelism around a tensor-parallel MLP, forward and backward.

``y = gelu(layer_norm(x) @ w1.T + b1) @ w2.T + b2`` on ``x: [batch, seq, d_model]``. The sequence
is sharded over the group (``Shard(1)``, DTensor's rule: uneven, even empty, shards); the
LayerNorm runs on each rank's own tokens with replicated ``ln_weight``/``ln_bias``. Then:

* all-gather of the sequence (backward: reduce-scatter of the input gradient);
* column-parallel ``w1``/``b1`` (``Shard(0)``), GELU, row-parallel ``w2`` (``Shard(1)``);
* reduce-scatter of the partial outputs back to sequence shards (backward: all-gather), then the
  replicated bias ``b2`` on the local tokens.

The replicated parameters used on local tokens only (``ln_weight``, ``ln_bias``, ``b2``) get a
partial gradient on each rank, which is all-reduced after backward (Megatron's
sequence-parallel gradient all-reduce). Backward is driven by a random cotangent ``dy``.

Planted bugs: ``ln_grad_not_reduced`` (that all-reduce is skipped: right on one rank) and
``bias_before_reduce_scatter`` (``b2`` added to every rank's partial sum: right on one rank).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets, split_sizes

EPS = 1e-5
SEQ = shardfuzz.Shard(1)  # sequence-sharded activations [batch, seq, d_model]
SP_PARAMS = ("ln_weight", "ln_bias", "b2")  # replicated, used on local tokens: grads all-reduced


def inputs(case):
    b, s, d, h = (case.sizes[k] for k in ("batch", "seq", "d_model", "hidden"))
    g = generator(case)
    return {
        "x": randn(case, b, s, d, gen=g),
        "ln_weight": 1 + randn(case, d, gen=g, scale=0.1, profile=False),
        "ln_bias": randn(case, d, gen=g, scale=0.1, profile=False),
        "w1": randn(case, h, d, gen=g, role="weight", scale=d**-0.5),
        "b1": randn(case, h, gen=g, role="weight"),
        "w2": randn(case, d, h, gen=g, role="weight", scale=h**-0.5),
        "b2": randn(case, d, gen=g, role="weight"),
        "dy": randn(case, b, s, d, gen=g, profile=False),
    }


def oracle(inp, case):
    params = ("x", "ln_weight", "ln_bias", "w1", "b1", "w2", "b2")
    x, lw, lb, w1, b1, w2, b2 = (inp[k].clone().requires_grad_() for k in params)
    y = F.linear(F.gelu(F.linear(F.layer_norm(x, lw.shape, lw, lb, EPS), w1, b1)), w2, b2)
    y.backward(inp["dy"])
    grads = {f"grad_{k}": t.grad for k, t in zip(params, (x, lw, lb, w1, b1, w2, b2))}
    return {"y": y.detach(), **grads}


# -- sequence-parallel collectives (uneven shards travel padded to the largest one) -----------
def _all_gather_seq(t, group, seq_len):
    sizes = split_sizes(seq_len, dist.get_world_size(group))
    padded = F.pad(t, (0, 0, 0, max(sizes) - t.shape[1])).contiguous()
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p[:, :n] for p, n in zip(parts, sizes)], dim=1)


def _reduce_scatter_seq(t, group):
    full = t.contiguous().clone()
    dist.all_reduce(full, group=group)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    off, n = split_offsets(t.shape[1], size)[rank], split_sizes(t.shape[1], size)[rank]
    return full[:, off : off + n].clone()


class GatherSequence(torch.autograd.Function):
    """All-gather of the sequence forward, reduce-scatter of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, seq_len):
        ctx.group = group
        return _all_gather_seq(x, group, seq_len)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter_seq(grad, ctx.group), None, None


class ReduceScatterSequence(torch.autograd.Function):
    """Reduce-scatter of the sequence forward, all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.seq_len = group, x.shape[1]
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.group, ctx.seq_len), None


def sequence_parallel_mlp(ctx, *, reduce_sp_grads=True, bias_before_reduce_scatter=False):
    group, seq_len = ctx.group, ctx.inputs["x"].shape[1]
    leaves = {k: ctx.local[k].clone().requires_grad_() for k in ("x", *SP_PARAMS, "w1", "b1", "w2")}
    x, lw, lb, b2 = leaves["x"], leaves["ln_weight"], leaves["ln_bias"], leaves["b2"]
    h = F.layer_norm(x, lw.shape, lw, lb, EPS)  # local tokens only
    h = GatherSequence.apply(h, group, seq_len)  # [b, seq, d] on every rank
    h = F.gelu(F.linear(h, leaves["w1"], leaves["b1"]))  # this rank's hidden columns
    partial = F.linear(h, leaves["w2"])  # this rank's share of every token's output
    if bias_before_reduce_scatter:
        partial = partial + b2
    y = ReduceScatterSequence.apply(partial, group)  # back to local tokens
    if not bias_before_reduce_scatter:
        y = y + b2
    y.backward(ctx.local["dy"])
    if reduce_sp_grads:
        for name in SP_PARAMS:
            dist.all_reduce(leaves[name].grad, group=group)
    return {"y": y.detach(), **{f"grad_{k}": t.grad for k, t in leaves.items()}}


def reference(ctx):
    return sequence_parallel_mlp(ctx)


def ln_grad_not_reduced(ctx):  # planted: each rank keeps its own tokens' LayerNorm/bias grads
    return sequence_parallel_mlp(ctx, reduce_sp_grads=False)


def bias_before_reduce_scatter(ctx):  # planted: y holds group_size copies of b2
    return sequence_parallel_mlp(ctx, bias_before_reduce_scatter=True)


TARGET = shardfuzz.Target(
    name="sp_layernorm_mlp",
    description="sequence-parallel LayerNorm + column/row-parallel MLP, forward and backward",
    cases=lambda world_sizes=None: sst.cases(
        "sp_layernorm_mlp",
        sizes={
            "batch": sst.Free(1, 3),
            "seq": sst.Split(min_per_rank=1, max_per_rank=3),
            "d_model": sst.Free(1, 6),
            "hidden": sst.Split(min_per_rank=1, max_per_rank=3),
        },
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={
        "x": SEQ,
        "dy": SEQ,
        "w1": shardfuzz.Shard(0),
        "b1": shardfuzz.Shard(0),
        "w2": shardfuzz.Shard(1),
    },
    outputs={
        "y": SEQ,
        "grad_x": SEQ,
        "grad_ln_weight": shardfuzz.Replicate(),
        "grad_ln_bias": shardfuzz.Replicate(),
        "grad_w1": shardfuzz.Shard(0),
        "grad_b1": shardfuzz.Shard(0),
        "grad_w2": shardfuzz.Shard(1),
        "grad_b2": shardfuzz.Replicate(),
    },
    implementations={
        "reference": reference,
        "ln_grad_not_reduced": ln_grad_not_reduced,
        "bias_before_reduce_scatter": bias_before_reduce_scatter,
    },
    gradients=("grad_x", "grad_ln_weight", "grad_ln_bias", "grad_w1", "grad_b1", "grad_w2", "grad_b2"),
)
