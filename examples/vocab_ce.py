"""Vocab-parallel cross-entropy with class weights and an ignore index, forward and backward.

``loss = F.cross_entropy(logits, labels, weight=class_weight, ignore_index=ignore_index)`` (the
weighted mean: the sum of ``w[label] * nll`` over the kept tokens divided by the sum of their
``w[label]``) and its gradient with respect to ``logits: [tokens, vocab]``. The logits and the class
weights are sharded on the vocab dim the way DTensor's ``Shard`` does it (``shardfuzz.Shard``'s
default rule: ``ceil(vocab / W)`` columns per rank until they run out, so 5 columns on 4 ranks are
``[2, 2, 1, 0]`` and a rank may hold none); the labels are replicated. Per rank, as in Megatron:
global max (all-reduce MAX), global sum of ``exp`` (all-reduce SUM), the label's logit and class
weight from the rank that holds the label (all-reduce SUM); the backward is local:
``(softmax - onehot) * w[label] / sum of w[label]``.

Option ``ignore_index``: ``-100`` (PyTorch's default) or ``0`` (a pad token that is also a vocab
id). About 30% of the labels are ignored; when all are (or all labels are the pad id 0), the loss
is NaN (0 / 0) and the gradient 0, as with ``F.cross_entropy``.

The logits are drawn as ``role="scores"`` with the ``edge`` profile: its ``max`` kind puts a finite
mask of float16's lowest value (-65504, scaled by 2**-k) into one vocab column of every token, as
vocabulary padding does.

Planted bugs: ``ignore_negative_only`` (ignores labels ``< 0`` rather than ``== ignore_index``:
wrong when the pad id is a vocab id) and ``local_weight_sum`` (the denominator sums the class
weights of the labels in this rank's vocab shard only: right on one rank).
"""

import hypothesis.strategies as st
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets

VOCAB = shardfuzz.Shard(1)  # [tokens, vocab], DTensor's rule


def inputs(case):
    t, v = case.sizes["tokens"], case.sizes["vocab"]
    g = generator(case)
    labels = torch.randint(0, v, (t,), generator=g)
    ignored = torch.rand(t, generator=g) < 0.3
    return {
        # a softmax's input itself: the edge profile's max writes a finite mask (-65504) into it
        "logits": randn(case, t, v, gen=g, role="scores"),
        "class_weight": (0.5 + 1.5 * torch.rand(v, generator=g)).to(getattr(torch, case.dtype)),
        "labels": labels.masked_fill(ignored, case.options["ignore_index"]),
    }


def oracle(inp, case):
    logits = inp["logits"].clone().requires_grad_()
    loss = F.cross_entropy(
        logits, inp["labels"], weight=inp["class_weight"], ignore_index=case.options["ignore_index"]
    )
    loss.backward()
    return {"loss": loss.detach(), "grad_logits": logits.grad}


class VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, class_weight, labels, ignore_index, start, group, bug=None):
        z = logits.to(torch.promote_types(logits.dtype, torch.float32))  # Megatron upcasts
        n_local = z.shape[1]
        ignored = labels < 0 if bug == "ignore_negative_only" else labels == ignore_index
        mine = ~ignored & (labels >= start) & (labels < start + n_local)  # kept labels in this shard
        local_idx = (labels - start).clamp(0, max(n_local - 1, 0))

        zmax = z.amax(1) if n_local else z.new_full((z.shape[0],), -torch.inf)
        dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=group)
        exp = torch.exp(z - zmax[:, None])
        sum_exp = exp.sum(1)
        dist.all_reduce(sum_exp, group=group)
        picked = torch.zeros(2, z.shape[0], dtype=z.dtype)  # the label's logit and class weight
        if n_local:
            picked[0] = torch.where(mine, z.gather(1, local_idx[:, None])[:, 0], 0)
            picked[1] = torch.where(mine, class_weight.to(z.dtype)[local_idx], 0)
        local_weight_sum = picked[1].sum()
        dist.all_reduce(picked, group=group)
        z_label, w_label = picked  # 0 for ignored tokens
        denominator = local_weight_sum if bug == "local_weight_sum" else w_label.sum()
        nll = torch.log(sum_exp) + zmax - z_label
        loss = (w_label * nll).sum() / denominator

        softmax = exp / sum_exp[:, None]
        onehot = torch.zeros_like(softmax)
        if n_local:
            onehot[mine, local_idx[mine]] = 1
        # a token's share of the gradient; 0 for ignored tokens, even when all are (0 / 0)
        ctx.save_for_backward(softmax - onehot, torch.where(w_label > 0, w_label / denominator, 0))
        ctx.dtype = logits.dtype
        return loss.to(logits.dtype)

    @staticmethod
    def backward(ctx, grad):
        diff, scale = ctx.saved_tensors
        return (diff * (scale * grad.to(diff.dtype))[:, None]).to(ctx.dtype), *[None] * 6


def vocab_parallel_ce(ctx, bug=None):
    logits = ctx.local["logits"].clone().requires_grad_()
    labels, ignore_index = ctx.inputs["labels"], ctx.case.options["ignore_index"]
    start = split_offsets(ctx.inputs["logits"].shape[1], ctx.group_size)[ctx.group_rank]
    loss = VocabParallelCrossEntropy.apply(
        logits, ctx.local["class_weight"], labels, ignore_index, start, ctx.group, bug
    )
    loss.backward()
    return {"loss": loss.detach(), "grad_logits": logits.grad}


def reference(ctx):
    return vocab_parallel_ce(ctx)


def ignore_negative_only(ctx):  # planted: pad id 0 counted as a real label
    return vocab_parallel_ce(ctx, bug="ignore_negative_only")


def local_weight_sum(ctx):  # planted: the weighted mean's denominator is never all-reduced
    return vocab_parallel_ce(ctx, bug="local_weight_sum")


TARGET = shardfuzz.Target(
    name="vocab_ce",
    description="vocab-parallel weighted cross-entropy with ignore_index, loss and logits gradient",
    cases=lambda world_sizes=None: sst.cases(
        "vocab_ce",
        sizes={
            "tokens": sst.Free(1, 6),
            # min_size=2: a vocabulary of one class has a loss and a gradient of 0 whatever the code
            # does (a quarter of the passes were so without it)
            "vocab": sst.Split(min_per_rank=0, max_per_rank=4, allow_empty=True, min_size=2),
        },
        options={"ignore_index": st.sampled_from([-100, 0])},
        world_sizes=world_sizes,
        profiles=("normal", "large", "ties", "edge"),
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={"logits": VOCAB, "class_weight": shardfuzz.Shard(0)},
    outputs={"loss": shardfuzz.Replicate(), "grad_logits": VOCAB},
    implementations={
        "reference": reference,
        "ignore_negative_only": ignore_negative_only,
        "local_weight_sum": local_weight_sum,
    },
    gradients=("grad_logits",),
)
