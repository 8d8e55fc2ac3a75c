"""Vocab-parallel embedding and vocab-parallel cross-entropy with label smoothing (Megatron style).

The vocabulary is split over the TP group with the ``tensor_split`` rule (Megatron's
``VocabUtility``: the first ``V % tp`` ranks get one extra row). Per rank:

* embedding: tokens outside ``[start, end)`` are masked, local ids are ``token - start``, the
  masked rows are zeroed and the result is all-reduced (``g``);
* output projection: ``logits_local = f(h) @ w_out_local.T``;
* cross-entropy: a custom autograd Function (as in Megatron) that all-reduces the max, the sum of
  exponentials, the target logit and, for label smoothing ``eps``, the sum of logits over the
  *global* vocabulary: ``loss = (1 - eps) * (lse - z_label) + eps * (lse - mean_v z_v)``.

Outputs: per-token ``loss`` (replicated), ``grad_emb`` and ``grad_w_out`` (``Shard(0,
rule="tensor_split")``). Backward is driven by a random per-token cotangent. The collectives
of the embedding and the projection are Megatron's ``g`` and ``f``
(:class:`shardfuzz.parallel.ReduceFromGroup`, :class:`shardfuzz.parallel.CopyToGroup`).

Planted bugs: the ``PLANTED`` records at the end of this file.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz.strategies as sst
from shardfuzz import Expect, PlantedBug, Replicate, Shard, Target
from shardfuzz.inputs import generator, randn
from shardfuzz.layouts import split_offsets, split_sizes
from shardfuzz.parallel import CopyToGroup, ReduceFromGroup

VOCAB = Shard(0, rule="tensor_split")

SIZES = {
    "batch": sst.Free(1, 2),
    "seq": sst.Free(1, 3),
    "d_model": sst.Free(1, 4),
    "vocab": sst.Split(min_per_rank=1, max_per_rank=3, min_size=2),  # one class: loss = 0
}


def cases(world_sizes=None):
    return sst.cases(
        "vocab_parallel",
        sizes=SIZES,
        options={"smoothing": st.sampled_from([0.0, 0.1, 0.3])},
        world_sizes=world_sizes,
    )


def inputs(case):
    b, s, d, v = (case.sizes[k] for k in ("batch", "seq", "d_model", "vocab"))
    g = generator(case)
    tokens = torch.randint(0, v, (b, s), generator=g)
    labels = torch.randint(0, v, (b, s), generator=g)
    # not seed luck: the first token and label are always the first id of the last rank's shard,
    # so bugs that are right on rank 0 show at any seed (and shrinking keeps them)
    first_of_last = split_offsets(v, case.group_size, VOCAB.rule)[-1]
    tokens[0, 0] = labels[0, 0] = first_of_last
    # and not every token the same (token, label) pair, so the per-token loss is not constant
    if b * s > 1:
        labels.view(-1)[-1] = (first_of_last + 1) % v
    return {
        "tokens": tokens,
        "labels": labels,
        "emb": randn(case, v, d, gen=g, role="weight"),
        "w_out": randn(case, v, d, gen=g, scale=d**-0.5, role="weight"),
        "dloss": randn(case, b, s, gen=g, role="cotangent"),  # the loss scale: large under `large`
    }


def oracle(inp, case):
    emb = inp["emb"].clone().requires_grad_()
    w_out = inp["w_out"].clone().requires_grad_()
    h = F.embedding(inp["tokens"], emb)
    logits = F.linear(h, w_out)
    v = logits.shape[-1]
    loss = F.cross_entropy(
        logits.reshape(-1, v),
        inp["labels"].reshape(-1),
        reduction="none",
        label_smoothing=case.options["smoothing"],
    ).view(inp["labels"].shape)
    loss.backward(inp["dloss"])
    return {"loss": loss, "grad_emb": emb.grad, "grad_w_out": w_out.grad}


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron's vocab-parallel cross-entropy with label smoothing, forward and backward."""

    @staticmethod
    def forward(ctx, logits, labels, start, vocab, eps, group, smoothing_bug=None, exp2=False):
        local_v = logits.shape[-1]
        lmax = (
            logits.max(dim=-1).values
            if local_v
            else torch.full(logits.shape[:-1], -torch.inf, dtype=logits.dtype)
        )
        dist.all_reduce(lmax, op=dist.ReduceOp.MAX, group=group)
        z = logits - lmax.unsqueeze(-1)
        exp = z.exp2() if exp2 else z.exp()  # bf16_exp2: the log2(e) factor forgotten
        sum_exp = exp.sum(-1)
        dist.all_reduce(sum_exp, group=group)
        in_range = (labels >= start) & (labels < start + local_v)
        local_label = (labels - start).clamp(0, max(local_v - 1, 0))
        z_label = (
            z.gather(-1, local_label.unsqueeze(-1)).squeeze(-1) if local_v else torch.zeros_like(sum_exp)
        )
        z_label = torch.where(in_range, z_label, torch.zeros_like(z_label))
        dist.all_reduce(z_label, group=group)
        log_sum = sum_exp.log()
        loss = log_sum - z_label
        if eps:
            if smoothing_bug == "local_smoothing":  # NVIDIA/Megatron-LM#737: local size and mean
                mean_z = z.sum(-1) / local_v
                n = local_v
            else:
                # even_vocab_smoothing: the vocab size as local size x tp (an even split assumed)
                n = local_v * dist.get_world_size(group) if smoothing_bug == "even_vocab_smoothing" else vocab
                sum_z = z.sum(-1)
                dist.all_reduce(sum_z, group=group)
                mean_z = sum_z / n
            loss = (1 - eps) * loss + eps * (log_sum - mean_z)
        else:
            n = vocab
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, in_range, local_label)
        ctx.eps, ctx.n = eps, n
        return loss

    @staticmethod
    def backward(ctx, grad):
        softmax, in_range, local_label = ctx.saved_tensors
        g = softmax.clone()
        onehot = torch.zeros_like(g)
        if g.shape[-1]:
            onehot.scatter_(-1, local_label.unsqueeze(-1), in_range.unsqueeze(-1).to(g.dtype))
        g = g - (1 - ctx.eps) * onehot - ctx.eps / ctx.n
        return g * grad.unsqueeze(-1), None, None, None, None, None, None, None


def reference(ctx, *, bug: str | None = None):
    """Vocab-parallel embedding and cross-entropy; ``bug`` plants one of the ``PLANTED`` bugs."""
    tokens, labels = ctx.inputs["tokens"], ctx.inputs["labels"]
    vocab = ctx.inputs["emb"].shape[0]
    emb = ctx.local["emb"].clone().requires_grad_()
    w_out = ctx.local["w_out"].clone().requires_grad_()
    start = VOCAB.global_index((0, 0), ctx.group_rank, ctx.group_size, tuple(ctx.inputs["emb"].shape))[0]
    local_v = emb.shape[0]
    outside = (tokens < start) | (tokens >= start + local_v)
    ids = (
        tokens.clamp(0, local_v - 1)
        if bug == "embedding_no_offset"
        else (tokens - start).clamp(0, local_v - 1)
    )
    h = F.embedding(ids, emb) * (~outside).unsqueeze(-1).to(emb.dtype)
    h = ReduceFromGroup.apply(h, ctx.group)
    logits = F.linear(CopyToGroup.apply(h, ctx.group), w_out)
    exp2 = bug == "bf16_exp2" and logits.dtype == torch.bfloat16  # the bf16 "fast kernel"
    eps = ctx.case.options["smoothing"]
    loss = VocabParallelCrossEntropy.apply(logits, labels, start, vocab, eps, ctx.group, bug, exp2)
    loss.backward(ctx.inputs["dloss"])
    return {"loss": loss.detach(), "grad_emb": emb.grad, "grad_w_out": w_out.grad}


def _rows_off_rank0(case):
    """The most vocab rows a rank other than rank 0 holds (0 on one rank)."""
    return max(split_sizes(case.sizes["vocab"], case.group_size, VOCAB.rule)[1:], default=0)


GRADIENTS = ("grad_emb", "grad_w_out")

TRIGGERS = {
    "smoothing>0": lambda c: c.options["smoothing"] > 0,
    "smoothing>0 with tp>1": lambda c: c.options["smoothing"] > 0 and c.group_size > 1,
    # rank 0's offset is 0: an offset bug needs a later rank with 2+ rows (one row hides it in the clamp)
    "2+ vocab rows off rank 0": lambda c: _rows_off_rank0(c) >= 2,
    "uneven vocab on 3 ranks": lambda c: c.group_size == 3 and c.sizes["vocab"] % 3 != 0,
}

PLANTED = [
    PlantedBug(
        "even_vocab_smoothing",
        "label smoothing divides by the local vocab size x tp, as if the split were even: right on "
        "even vocabularies and without smoothing (needs an uneven vocab and smoothing > 0)",
        Expect(
            "mismatch",
            2,
            (2,),
            uneven=("vocab",),
            check=lambda c: c.options["smoothing"] == 0.1,
            note="smoothing 0.1",
            needs=("uneven", "smoothing>0"),
        ),
        p95=1,
    ),
    PlantedBug(
        "local_smoothing",
        "label smoothing uses the local vocab size and local mean (tp > 1 and smoothing > 0)",
        Expect("mismatch", 2, (2,), check=lambda c: c.options["smoothing"] == 0.1, note="smoothing 0.1"),
        p95=1,
        link="NVIDIA/Megatron-LM#737",
    ),
    PlantedBug(
        "embedding_no_offset",
        "token ids not shifted by the rank's vocab offset; rank 0 is right, and so is a rank holding "
        "one row (an expert-id bug's pattern, in an embedding)",
        Expect(
            "mismatch",
            2,
            (2,),
            check=lambda c: c.options["smoothing"] == 0.0 and c.sizes["vocab"] == 4,
            note="vocab 4",
        ),
        p95=2,
        link="flashinfer-ai/flashinfer#3547",
    ),
    PlantedBug(
        "bf16_exp2",
        "bf16 fast cross-entropy kernel computes exp as exp2 without the log2(e) factor (a softmax at "
        "temperature 1/ln 2); fp32 and fp64 right",
        Expect("mismatch", (1, 2), None, uneven=None, check=lambda c: c.dtype == "bfloat16", note="bfloat16"),
        p95=2,
    ),
]

TARGET = Target(
    name="vocab_parallel",
    description="vocab-parallel embedding + vocab-parallel cross-entropy with label smoothing (tensor_split rule)",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs={"loss": Replicate(), "grad_emb": VOCAB, "grad_w_out": VOCAB},
    input_layouts={"emb": VOCAB, "w_out": VOCAB},
    implementations={"reference": "reference"},
    planted=PLANTED,
    triggers=TRIGGERS,
    gradients=GRADIENTS,
    collectives=("all_reduce",),
)
