"""Vocab-parallel embedding and vocab-parallel cross-entropy (Megatron style), with the options of
``F.cross_entropy``: class weights, ``ignore_index``, reductions and label smoothing.

The vocabulary is split over the TP group by the option ``rule``: ``tensor_split`` (Megatron's
``VocabUtility``: the first ``V % tp`` ranks get one extra row) or ``dtensor`` (DTensor's
``Shard(0)``: ``ceil(V / tp)`` rows per rank until they run out, so a rank may hold none). Per rank:

* embedding: tokens outside ``[start, end)`` are masked, local ids are ``token - start``, the
  masked rows are zeroed and the result is all-reduced (``g``);
* output projection: ``logits_local = f(h) @ w_out_local.T``;
* cross-entropy: a custom autograd Function (as in Megatron) that all-reduces the max, the sum of
  exponentials, the label's logit and the weighted sum of logits over the *global* vocabulary.
  Per token ``t`` with label ``y`` (kept: ``y != -100``), class weights ``w`` (all 1 without
  ``class_weight``) and ``C`` classes, as ``F.cross_entropy`` defines it::

      nll_t    = w_y * (lse_t - z_ty)
      smooth_t = sum_c w_c * (lse_t - z_tc) / C
      loss_t   = (1 - eps) * nll_t + eps * smooth_t         (0 where ignored)

  reduced by ``reduction``: ``none`` (per token), ``sum``, or ``mean`` (the sum divided by the sum
  of ``w_y`` over kept tokens).

Options: ``smoothing`` (``eps``), ``rule``, ``class_weight`` (weights drawn in ``[0.5, 2]``,
replicated), ``ignore_index`` (about 30% of the labels are ``-100``, and the last one when there
are two or more; the first token is always kept, so a mean is never 0 / 0), ``reduction``. Outputs: ``loss`` (replicated: ``[batch, seq]`` for
``none``, a scalar otherwise), ``grad_emb`` and ``grad_w_out`` (``Shard(0)`` under ``rule``).
Backward is driven by a random cotangent of the loss's shape. The collectives of the embedding and
the projection are Megatron's ``g`` and ``f`` (:class:`shardfuzz.spec.parallel.ReduceFromGroup`,
:class:`shardfuzz.spec.parallel.CopyToGroup`).

PyTorch's own ``loss_parallel`` is built in as implementations (``targets/vocab_parallel_torch.py``);
planted bugs: the ``PLANTED`` records, expected failures: the ``EXPECTED`` records at the end.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz.strategies as sst
from shardfuzz import (
    CommBudget,
    Expect,
    ExpectedFailure,
    PlantedBug,
    Replicate,
    Shard,
    Target,
    Verified,
    bind,
)
from shardfuzz.spec.budget import all_reduce_bytes
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets, split_sizes
from shardfuzz.spec.parallel import CopyToGroup, ReduceFromGroup

IGNORE = -100  # F.cross_entropy's default ignore_index
RULES = ("tensor_split", "dtensor")
REDUCTIONS = ("none", "mean", "sum")

SIZES = {
    "batch": sst.Free(1, 2),
    "seq": sst.Free(1, 3),
    "d_model": sst.Free(1, 4),
    # fewer classes than ranks leaves ranks empty; one class is degenerate (loss = 0), so >= 2
    "vocab": sst.Split(min_per_rank=0, max_per_rank=3, allow_empty=True, min_size=2),
}


def cases(world_sizes=None):
    return sst.cases(
        "vocab_parallel",
        sizes=SIZES,
        options={
            "smoothing": st.sampled_from([0.0, 0.1, 0.3]),
            "rule": st.sampled_from(RULES),
            "class_weight": st.booleans(),
            "ignore_index": st.booleans(),
            "reduction": st.sampled_from(REDUCTIONS),
        },
        world_sizes=world_sizes,
    )


def vocab_layout(case) -> Shard:
    return Shard(0, rule=case.options.get("rule", "tensor_split"))


def outputs(case):
    vocab = vocab_layout(case)
    return {"loss": Replicate(), "grad_emb": vocab, "grad_w_out": vocab}


def inputs(case):
    b, s, d, v = (case.sizes[k] for k in ("batch", "seq", "d_model", "vocab"))
    g = generator(case)
    tokens = torch.randint(0, v, (b, s), generator=g)
    labels = torch.randint(0, v, (b, s), generator=g)
    # not seed luck: the first token and label are always the first id of the last non-empty
    # shard, so bugs that are right on rank 0 show at any seed (and shrinking keeps them)
    sizes = split_sizes(v, case.group_size, vocab_layout(case).rule)
    last = max(r for r, n in enumerate(sizes) if n)
    first_of_last = split_offsets(v, case.group_size, vocab_layout(case).rule)[last]
    tokens[0, 0] = labels[0, 0] = first_of_last
    # and not every token the same (token, label) pair, so the per-token loss is not constant
    if b * s > 1:
        labels.view(-1)[-1] = (first_of_last + 1) % v
    ignored = torch.rand(b, s, generator=g) < 0.3
    ignored.view(-1)[0] = False  # a kept token: a mean is never 0 / 0
    ignored.view(-1)[-1] = b * s > 1  # and, not by seed luck, an ignored one when there are two
    if case.options.get("ignore_index", False):
        labels = labels.masked_fill(ignored, IGNORE)
    weight = 0.5 + 1.5 * torch.rand(v, generator=g)
    loss_shape = (b, s) if case.options.get("reduction", "none") == "none" else ()
    out = {
        "tokens": tokens,
        "labels": labels,
        "emb": randn(case, v, d, gen=g, role="weight"),
        "w_out": randn(case, v, d, gen=g, scale=d**-0.5, role="weight"),
        "dloss": randn(case, *loss_shape, gen=g, role="cotangent"),  # the loss scale
    }
    if case.options.get("class_weight", False):
        out["class_weight"] = weight.to(getattr(torch, case.dtype))
    return out


def cross_entropy_options(inp, case) -> dict:
    """The keyword arguments of ``F.cross_entropy`` this case uses."""
    return {
        "weight": inp.get("class_weight"),
        "ignore_index": IGNORE,
        "reduction": case.options.get("reduction", "none"),
        "label_smoothing": case.options["smoothing"],
    }


def oracle(inp, case):
    emb = inp["emb"].clone().requires_grad_()
    w_out = inp["w_out"].clone().requires_grad_()
    h = F.embedding(inp["tokens"], emb)
    logits = F.linear(h, w_out)
    v = logits.shape[-1]
    loss = F.cross_entropy(
        logits.reshape(-1, v), inp["labels"].reshape(-1), **cross_entropy_options(inp, case)
    )
    loss = loss.view(inp["dloss"].shape)
    loss.backward(inp["dloss"])
    return {"loss": loss, "grad_emb": emb.grad, "grad_w_out": w_out.grad}


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Megatron's vocab-parallel cross-entropy, forward and backward: per token, the weighted NLL
    and the smoothing term ``sum_c w_c (lse - z_c) / C`` over the global vocabulary (0 where the
    label is ignored). ``w_local``: this rank's class weights; ``w_label``: the label's weight."""

    @staticmethod
    def forward(ctx, logits, labels, w_local, w_label, start, vocab, group, bug=None, exp2=False):
        local_v = logits.shape[-1]
        lmax = (
            logits.max(dim=-1).values
            if local_v
            else torch.full(logits.shape[:-1], -torch.inf, dtype=logits.dtype)
        )
        if bug == "gathered_max":  # every rank's logits gathered to find the max: right, V/tp x bytes
            size = dist.get_world_size(group)
            padded = F.pad(logits, (0, -(-vocab // size) - local_v), value=-torch.inf)
            everyone = padded.new_empty(size * padded.numel())
            dist.all_gather_into_tensor(everyone, padded.reshape(-1), group=group)
            lmax = everyone.view(size, *padded.shape).amax(dim=(0, -1))
        else:
            dist.all_reduce(lmax, op=dist.ReduceOp.MAX, group=group)
        z = logits - lmax.unsqueeze(-1)
        exp = z.exp2() if exp2 else z.exp()  # bf16_exp2: the log2(e) factor forgotten
        sum_exp = exp.sum(-1)
        dist.all_reduce(sum_exp, group=group)
        kept = labels != IGNORE
        in_range = kept & (labels >= start) & (labels < start + local_v)
        local_label = (labels - start).clamp(0, max(local_v - 1, 0))
        z_label = (
            z.gather(-1, local_label.unsqueeze(-1)).squeeze(-1) if local_v else torch.zeros_like(sum_exp)
        )
        z_label = torch.where(in_range, z_label, torch.zeros_like(z_label))
        dist.all_reduce(z_label, group=group)
        lse = sum_exp.log()
        nll = w_label * (lse - z_label)
        # the smoothing term's sums run over the global vocab: sum_c w_c and sum_c w_c z_c
        w_sum, wz = w_local.sum(), (z * w_local).sum(-1)
        n = vocab
        if bug == "local_smoothing":  # NVIDIA/Megatron-LM#737: local vocab size and local sums
            n = local_v
        else:
            dist.all_reduce(w_sum, group=group)
            dist.all_reduce(wz, group=group)
            if bug == "even_vocab_smoothing":  # the vocab size as local size x tp (an even split)
                n = local_v * dist.get_world_size(group)
        smooth = (w_sum * lse - wz) / n
        zero = torch.zeros_like(nll)
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, in_range, kept, local_label, w_local, w_label, w_sum)
        ctx.n = n
        return torch.where(kept, nll, zero), torch.where(kept, smooth, zero)

    @staticmethod
    def backward(ctx, grad_nll, grad_smooth):
        softmax, in_range, kept, local_label, w_local, w_label, w_sum = ctx.saved_tensors
        onehot = torch.zeros_like(softmax)
        if softmax.shape[-1]:
            onehot.scatter_(-1, local_label.unsqueeze(-1), in_range.unsqueeze(-1).to(softmax.dtype))
        g_nll = torch.where(kept, grad_nll * w_label, torch.zeros_like(grad_nll)).unsqueeze(-1)
        g_smooth = torch.where(kept, grad_smooth, torch.zeros_like(grad_smooth)).unsqueeze(-1)
        grad = g_nll * (softmax - onehot) + g_smooth * (w_sum * softmax - w_local) / ctx.n
        return grad, None, None, None, None, None, None, None, None


def reduce_loss(nll, smooth, w_label, kept, case):
    """``F.cross_entropy``'s mix of the two terms and its reduction, on replicated per-token values."""
    eps = case.options["smoothing"]
    loss = (1 - eps) * nll + eps * smooth if eps else nll
    reduction = case.options.get("reduction", "none")
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / torch.where(kept, w_label, torch.zeros_like(w_label)).sum()


def reference(ctx, *, bug: str | None = None):
    """Vocab-parallel embedding and cross-entropy; ``bug`` plants one of the ``PLANTED`` bugs."""
    tokens, labels = ctx.inputs["tokens"], ctx.inputs["labels"]
    vocab = ctx.inputs["emb"].shape[0]
    layout = vocab_layout(ctx.case)
    emb = ctx.shard(ctx.inputs["emb"], layout).clone().requires_grad_()
    w_out = ctx.shard(ctx.inputs["w_out"], layout).clone().requires_grad_()
    # the offsets' rule: the layout's, or (the planted bug) tensor_split's on rows DTensor shards
    offsets_rule = "tensor_split" if bug == "tensor_split_offset" else layout.rule
    start = split_offsets(vocab, ctx.group_size, offsets_rule)[ctx.group_rank]
    local_v = emb.shape[0]
    outside = (tokens < start) | (tokens >= start + local_v)
    ids = tokens if bug == "embedding_no_offset" else tokens - start
    if local_v:
        h = F.embedding(ids.clamp(0, local_v - 1), emb)
    else:  # no rows: zeros, still in the graph, so this rank joins the backward's all-reduce
        h = emb.new_zeros((*tokens.shape, emb.shape[1])) + emb.sum()
    h = h * (~outside).unsqueeze(-1).to(emb.dtype)
    h = ReduceFromGroup.apply(h, ctx.group)
    logits = F.linear(CopyToGroup.apply(h, ctx.group), w_out)
    exp2 = bug == "bf16_exp2" and logits.dtype == torch.bfloat16  # the bf16 "fast kernel"
    weight = ctx.inputs.get("class_weight", torch.ones(vocab, dtype=logits.dtype))
    kept = labels != IGNORE
    w_label = weight[torch.where(kept, labels, 0)]
    nll, smooth = VocabParallelCrossEntropy.apply(
        logits,
        labels,
        layout.piece(weight, ctx.group_rank, ctx.group_size),
        w_label,
        start,
        vocab,
        ctx.group,
        bug,
        exp2,
    )
    loss = reduce_loss(nll, smooth, w_label, kept, ctx.case)
    loss.backward(ctx.inputs["dloss"])
    grad_emb = emb.grad if emb.grad is not None else torch.zeros_like(emb)  # a rank with no rows
    return {"loss": loss.detach(), "grad_emb": grad_emb, "grad_w_out": w_out.grad}


def _rows_off_rank0(case):
    """The most vocab rows a rank other than rank 0 holds (0 on one rank)."""
    return max(split_sizes(case.sizes["vocab"], case.group_size, vocab_layout(case).rule)[1:], default=0)


GRADIENTS = ("grad_emb", "grad_w_out")

TRIGGERS = {
    "smoothing>0": lambda c: c.options["smoothing"] > 0,
    "smoothing>0 with tp>1": lambda c: c.options["smoothing"] > 0 and c.group_size > 1,
    # rank 0's offset is 0: an offset bug needs a later rank with 2+ rows (one row hides it in the clamp)
    "2+ vocab rows off rank 0": lambda c: _rows_off_rank0(c) >= 2,
    "uneven vocab on 3 ranks": lambda c: c.group_size == 3 and c.sizes["vocab"] % 3 != 0,
    # the contract's options: the covering rows pair each with every other condition
    "class weights": lambda c: c.options["class_weight"],
    "ignored labels": lambda c: c.options["ignore_index"],
    "reduction=mean": lambda c: c.options["reduction"] == "mean",
    "reduction=sum": lambda c: c.options["reduction"] == "sum",
    "DTensor split rule": lambda c: c.options["rule"] == "dtensor",
}


def reference_comm(case) -> CommBudget:
    """Per rank, seven all-reduces of the case dtype: the embedding's partial rows (batch*seq*d_model)
    forward and their gradient backward, and per token the max, the sum of exp, the label's logit
    and the smoothing sum, and the class weights' total (one element)."""
    tokens, d = case.sizes["batch"] * case.sizes["seq"], case.sizes["d_model"]
    numels = [tokens * d, tokens, tokens, tokens, 1, tokens, tokens * d]
    sent = sum(all_reduce_bytes(k, case.group_size, case.dtype) for k in numels)
    why = "all-reduces of 2 x batch*seq*d_model, 4 x batch*seq and 1 element"
    return CommBudget(sent=sent, collectives=len(numels), why=why)


PLANTED = [
    PlantedBug(
        "gathered_max",
        "the global max of the logits found by all-gathering every rank's logits (the naive way), "
        "not by a MAX all-reduce of each rank's max: right values, vocab / tp times the bytes",
        Expect(
            kind="communication",
            world_size=(2, 3),
            mesh=None,
            uneven=None,
            note="3 ranks, or a wider vocab on 2",
        ),
        p95=2,
    ),
    PlantedBug(
        "even_vocab_smoothing",
        "label smoothing divides by the local vocab size x tp, as if the split were even: right on "
        "even vocabularies and without smoothing (needs an uneven vocab and smoothing > 0)",
        Expect(
            kind="mismatch",
            world_size=(2, 3),  # 3 ranks of vocab 2 ([1, 1, 0]) or 2 of vocab 3
            mesh=None,
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
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            check=lambda c: c.options["smoothing"] == 0.1,
            note="smoothing 0.1",
        ),
        p95=1,
        link="NVIDIA/Megatron-LM#737",
    ),
    PlantedBug(
        "embedding_no_offset",
        "token ids not shifted by the rank's vocab offset; rank 0 is right, and so is a rank holding "
        "one row (an expert-id bug's pattern, in an embedding)",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
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
        Expect(
            kind="mismatch",
            world_size=(1, 2),
            mesh=None,
            uneven=None,
            check=lambda c: c.dtype == "bfloat16",
            note="bfloat16",
        ),
        p95=2,
    ),
    PlantedBug(
        "tensor_split_offset",
        "vocab offsets by tensor_split's rule on rows sharded by DTensor's (torch.chunk's): right "
        "where the rules agree (2 ranks, 5 rows on 3) and where the rank they differ on holds no "
        "rows (4 on 3: [2, 2, 0]); wrong at 7 on 3 ([3, 3, 1], offsets [0, 3, 5] for [0, 3, 6])",
        Expect(
            kind="mismatch",
            world_size=3,
            mesh=(3,),
            uneven=("vocab",),
            check=lambda c: c.options["rule"] == "dtensor",
            note="a DTensor split, vocab 7 on 3 ranks",
            needs=("tensor_split != DTensor shards",),
        ),
        p95=10,
        link="pytorch/pytorch#188947",
    ),
]

#: PyTorch's loss_parallel with torchtitan's plan (targets/vocab_parallel_torch.py)
TORCH_LOSS_PARALLEL = "shardfuzz.targets.vocab_parallel_torch:torch_loss_parallel"

#: loss_parallel's known failures, as ``--exclude`` expressions (set aside and counted)
LOSS_PARALLEL_KNOWN = {
    "weight with ignore_index": "options['class_weight'] and options['ignore_index']",
    # DTensor's rule: ceil(V / tp) rows per rank, so some rank holds none iff ceil(V / tp) * (tp - 1) >= V
    "a rank with no class": "-(-sizes['vocab'] // group_size) * (group_size - 1) >= sizes['vocab']",
}
_WEIGHT_IGNORE, _NO_CLASS = LOSS_PARALLEL_KNOWN.values()

EXPECTED = [
    ExpectedFailure(
        "torch_loss_parallel_weight_ignore",
        "loss_parallel's backward with class weights and ignored labels gathers the weights at the "
        "raw labels, -100 included: IndexError 'index -100 is out of bounds'",
        Expect(
            kind="rank-error",
            world_size=1,
            mesh=(1,),
            check=lambda c: c.options["class_weight"] and c.options["ignore_index"],
            note="class weights and one ignored label",
            exclude=(_NO_CLASS,),
        ),
        p95=16,
        impl=bind(TORCH_LOSS_PARALLEL),
    ),
    ExpectedFailure(
        "torch_loss_parallel_no_class",
        "loss_parallel's forward on a rank that holds no class (DTensor's rule: 2 classes on 3 "
        "ranks are [1, 1, 0]) gathers from an empty shard: 'index 0 is out of bounds for dimension "
        "1 with size 0'",
        Expect(
            kind="rank-error",
            world_size=3,
            mesh=(3,),
            uneven=("vocab",),
            check=lambda c: c.sizes["vocab"] == 2,
            note="vocab 2",
            exclude=(_WEIGHT_IGNORE,),
        ),
        p95=1,
        impl=bind(TORCH_LOSS_PARALLEL),
    ),
    ExpectedFailure(
        "torch_loss_parallel_smoothing",
        "loss_parallel ignores label smoothing without an error (its docstring says 'not "
        "supported'): the loss and gradients of any smoothing > 0 are those of smoothing 0",
        Expect(
            kind="mismatch",
            world_size=1,
            mesh=(1,),
            check=lambda c: c.options["smoothing"] == 0.1,
            note="smoothing 0.1",
            exclude=(_WEIGHT_IGNORE, _NO_CLASS),
        ),
        p95=1,
        impl=bind(TORCH_LOSS_PARALLEL, smoothing=True),
    ),
]

# torchtitan's loss_parallel plan: tests/test_verified.py runs it
VERIFIED = [
    Verified(
        name="torch_loss_parallel",
        what="torch's loss_parallel (torchtitan's plan) with the contract's choices pinned (DTensor's "
        "vocab rule, no label smoothing: the expected failure torch_loss_parallel_smoothing) and its "
        "two crashes' regions set aside",
        examples=40,
        options={"rule": "dtensor", "smoothing": 0.0},
        exclude=tuple(LOSS_PARALLEL_KNOWN.values()),
        reaches=("reduction=mean", "reduction=sum", "class weights", "ignored labels", "uneven", "world>=3"),
    ),
]

TARGET = Target(
    name="vocab_parallel",
    description="vocab-parallel embedding + cross-entropy: class weights, ignore_index, reductions, label smoothing",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs=outputs,
    implementations={"reference": "reference", "torch_loss_parallel": TORCH_LOSS_PARALLEL},
    # loss_parallel's known failures are set aside per run (LOSS_PARALLEL_KNOWN), not target-wide
    planted=PLANTED,
    expected_failures=EXPECTED,
    verified=VERIFIED,
    triggers=TRIGGERS,
    gradients=GRADIENTS,
    collectives=("all_reduce",),
    comm={"reference": reference_comm},
)
