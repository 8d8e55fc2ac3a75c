"""MoE layer with expert parallelism: top-k router, capacity, aux loss, all-to-all dispatch and combine.

Tokens ``x`` (``[tokens, d_model]``) are sharded over the group (``Shard(0)``, DTensor's rule, so a
rank may hold none); the experts (``w1: [experts, d_model, hidden]``, ``w2: [experts, hidden,
d_model]``, GELU MLPs) are spread over the ranks in contiguous blocks (``Shard(0)``: 5 experts on 4
ranks are ``[2, 2, 1, 0]``, so a rank may hold none). The router ``wr: [experts, d_model]`` is
replicated. Per rank:

* **routing**: top-k over ``x @ wr.T + bias``, where ``bias`` is ``-inf`` for the last
  ``empty_experts`` experts (a structured draw: experts forced to receive nothing; never so many
  that fewer than k remain). ``k = min(top_k, experts)``. Ties: the routing decisions are made
  from logits computed by explicit elementwise ops in the case dtype (``sum_j x[:, j] * wr[:, j]``,
  bitwise identical per token in the oracle, even the float64 one, and on every rank), sorted by a
  stable sort, so a tie goes to the lower expert id everywhere. The ``ties`` profile makes ties
  common. Gate weights are the softmax probabilities (from the ordinary differentiable logits) of
  the chosen experts, renormalised over the k chosen when k >= 2 (not for top-1, where the weight
  stays the probability, as in Switch).
* **capacity** (``capacity_factor``: None for dropless, 1.0 or 0.5), per source rank: expert ``e``
  accepts at most ``ceil(cf * T * k / experts)`` of the ``T * k`` assignments of a rank's ``T``
  tokens; first choices win over second choices, then earlier tokens. A dropped assignment adds
  nothing to the output.
* **aux loss** (Switch/GShard load balancing): ``experts / (N * k) * sum_e count_e * mean_t p_te``
  over all ``N`` tokens, with ``count_e`` the assignments to ``e`` *before* capacity (the counts
  are all-reduced; each rank returns its tokens' share: ``Partial()``).
* **dispatch**: kept assignments are sorted by expert and sent to the expert's rank with
  ``all_to_all_single`` (uneven splits), with their expert and token ids; the experts run; the
  combine is the reverse all-to-all and a gate-weighted sum. Both all-to-alls are autograd
  Functions, so backward runs them reversed. Every rank joins every all-to-all, backward too: the
  expert output starts as ``received * 0``, so it stays in the autograd graph on a rank that
  received nothing or holds no experts (docs/design.md, D12: otherwise that rank skips the backward
  all-to-all and its peers hang).

Backward is driven by a random cotangent ``dy`` and a random scalar for the aux loss. Then one SGD
step (lr 0.5, weight decay 0.5) on the expert weights; an expert that received no tokens has no
gradient, so the reference gives it a zero gradient (NVIDIA-NeMo/Automodel#2995's fix) and it is
still decayed.

Outputs: ``y``, ``grad_x`` (``Shard(0)`` over tokens), ``aux`` and ``grad_router`` (``Partial()``:
the router's gradient is left for DDP to all-reduce), ``grad_w1``, ``grad_w2``, ``w1_next``,
``w2_next`` and ``routed`` (``Shard(0)`` over experts; ``routed[e, t]`` is True when expert ``e``
received token ``t``: a bool tensor, compared exactly).

Planted bugs: the ``PLANTED`` records at the end of this file (each a small change to the
reference, modelled on a real bug).

Value profiles: ``normal`` and ``ties``. ``large`` is left out: with logits of 1e4 and more, bf16
rounding moves logits by more than their gaps, so any implementation's softmax differs from the
float64 oracle beyond what a first-order tolerance can bound, and saturated gates hide the
routing bugs anyway.
"""

from __future__ import annotations

import functools
import math

import hypothesis.strategies as st
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz.strategies as sst
from shardfuzz import CommBudget, Expect, Partial, PlantedBug, Shard, Target
from shardfuzz.spec.budget import ITEMSIZE
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets, split_sizes
from shardfuzz.spec.parallel import AllToAll, all_reduce_by_all_to_all

LR, WEIGHT_DECAY = 0.5, 0.5

SIZES = {
    "tokens": sst.Split(min_per_rank=1, max_per_rank=3),
    "experts": sst.Split(min_per_rank=0, max_per_rank=2, allow_empty=True, min_size=2),
    "d_model": sst.Free(1, 3),
    "hidden": sst.Free(1, 3),
}


def cases(world_sizes=None):
    return sst.cases(
        "moe",
        sizes=SIZES,
        options={
            "top_k": st.sampled_from([1, 2]),
            "capacity_factor": st.sampled_from([None, 1.0, 0.5]),
            "empty_experts": st.sampled_from([0, 1, 2]),
        },
        world_sizes=world_sizes,
        profiles=("normal", "ties"),
    )


def _k(case) -> int:
    return min(case.options["top_k"], case.sizes["experts"])


def inputs(case):
    n, e, d, h = (case.sizes[k] for k in ("tokens", "experts", "d_model", "hidden"))
    g = generator(case)
    # keep k + 1 usable experts: with only k the gates are fixed and the router gradient is 0
    forced = max(0, min(case.options["empty_experts"], e - _k(case) - 1))
    bias = torch.zeros(e, dtype=getattr(torch, case.dtype))
    if forced:
        bias[e - forced :] = -math.inf
    return {
        "x": randn(case, n, d, gen=g),
        "wr": randn(case, e, d, gen=g, scale=d**-0.5, role="weight"),
        "bias": bias,
        "w1": randn(case, e, d, h, gen=g, scale=d**-0.5, profile=False),
        "w2": randn(case, e, h, d, gen=g, scale=h**-0.5, profile=False),
        "dy": randn(case, n, d, gen=g, profile=False),
        "daux": randn(case, 1, gen=g, profile=False).reshape(()),
    }


# -- routing decisions (shared by the oracle and the ranks) -------------------------------------
def selection_logits(x, wr, bias, dtype):
    """Router logits for the routing decisions, made by explicit elementwise ops in ``dtype``.

    Elementwise ops round each element the same way whatever the batch, so a token's logits are
    bitwise identical in the oracle (float64 inputs cast back to the case dtype: exact) and on its
    rank.
    """
    xs, ws = x.detach().to(dtype), wr.detach().to(dtype)
    z = xs[:, :1] * ws[:, 0]
    for j in range(1, xs.shape[1]):
        z = z + xs[:, j : j + 1] * ws[:, j]
    return z + bias.to(dtype)


def select(x, wr, bias, k: int, dtype):
    """Top-k expert ids ``[tokens, k]``; a stable sort breaks ties toward the lower expert id."""
    z = selection_logits(x, wr, bias, dtype)
    return torch.sort(z, dim=-1, descending=True, stable=True).indices[:, :k]


def keep_mask(idx, n_experts: int, capacity_factor, second_from_zero: bool = False):
    """Which of one rank's assignments ``idx [T, k]`` fit: first choices first, then token order.
    ``second_from_zero``: the planted bug ``second_choice_slots``."""
    t, k = idx.shape
    keep = torch.ones(t, k, dtype=torch.bool)
    if capacity_factor is None or t == 0:
        return keep
    cap = math.ceil(capacity_factor * t * k / n_experts)
    used = [0] * n_experts
    for s in range(k):
        if second_from_zero:  # GShard top-2 gating without locations2 += sum(mask1)
            used = [0] * n_experts
        for i in range(t):
            e = int(idx[i, s])
            keep[i, s] = used[e] < cap
            used[e] += 1
    return keep


def routing(inp, case):
    """The global routing: expert ids ``[N, k]`` and the capacity mask, per source rank."""
    dtype = getattr(torch, case.dtype)
    idx = select(inp["x"], inp["wr"], inp["bias"], _k(case), dtype)
    n_experts = inp["wr"].shape[0]
    sizes = split_sizes(idx.shape[0], case.group_size)
    keep = torch.cat(
        [keep_mask(part, n_experts, case.options["capacity_factor"]) for part in idx.split(sizes)]
    )
    return idx, keep


# -- the oracle ----------------------------------------------------------------------------------
def _gates(probs, idx, k: int, renorm_top1: bool = False):
    gate = probs.gather(1, idx)
    if k >= 2 or renorm_top1:
        gate = gate / gate.sum(-1, keepdim=True)
    return gate


def oracle(inp, case):
    idx, keep = routing(inp, case)
    k = idx.shape[1]
    x, wr, w1, w2 = (inp[n].clone().requires_grad_() for n in ("x", "wr", "w1", "w2"))
    n_tokens, n_experts = x.shape[0], wr.shape[0]
    probs = torch.softmax(F.linear(x, wr) + inp["bias"], dim=-1)
    gate = _gates(probs, idx, k) * keep.to(x.dtype)
    y = torch.zeros_like(x)
    for s in range(k):
        e = idx[:, s]
        hid = F.gelu(torch.einsum("nd,ndh->nh", x, w1[e]))
        y = y + gate[:, s : s + 1] * torch.einsum("nh,nhd->nd", hid, w2[e])
    counts = torch.bincount(idx.reshape(-1), minlength=n_experts).to(x.dtype)
    aux = n_experts / (n_tokens * k) * (counts * probs.mean(0)).sum()
    torch.autograd.backward([y, aux], [inp["dy"], inp["daux"]])
    routed = torch.zeros(n_experts, n_tokens, dtype=torch.bool)
    tok = torch.arange(n_tokens).unsqueeze(1).expand_as(idx)
    routed[idx[keep], tok[keep]] = True
    with torch.no_grad():
        w1_next = w1 - LR * (w1.grad + WEIGHT_DECAY * w1)
        w2_next = w2 - LR * (w2.grad + WEIGHT_DECAY * w2)
    return {
        "y": y.detach(),
        "aux": aux.detach(),
        "grad_x": x.grad,
        "grad_router": wr.grad,
        "grad_w1": w1.grad,
        "grad_w2": w2.grad,
        "w1_next": w1_next,
        "w2_next": w2_next,
        "routed": routed,
    }


# -- the expert-parallel implementation ---------------------------------------------------------
def reference(ctx, *, bug: str | None = None):
    """Expert-parallel MoE with all-to-all dispatch and combine; ``bug`` plants one of the ``PLANTED`` bugs."""
    case = ctx.case
    group, rank, g_size = ctx.group, ctx.group_rank, ctx.group_size
    k = _k(case)
    x = ctx.local["x"].clone().requires_grad_()
    wr = ctx.inputs["wr"].clone().requires_grad_()
    bias = ctx.inputs["bias"]
    n_tokens, d = ctx.inputs["x"].shape
    n_experts = wr.shape[0]
    first_token = split_offsets(n_tokens, g_size)[rank]
    first_expert = split_offsets(n_experts, g_size)[rank]
    # each local expert is its own pair of leaves, as in an nn.ModuleList
    w1s = [w.clone().requires_grad_() for w in ctx.local["w1"]]
    w2s = [w.clone().requires_grad_() for w in ctx.local["w2"]]

    # routing
    idx = select(x, wr, bias, k, x.dtype)
    keep = keep_mask(idx, n_experts, case.options["capacity_factor"], bug == "second_choice_slots")
    logits = F.linear(x, wr) + bias
    if bug == "bf16_exp2" and x.dtype == torch.bfloat16:  # the bf16 "fast kernel": exp2, no log2(e)
        e = (logits - logits.amax(-1, keepdim=True).detach()).exp2()
        probs = e / e.sum(-1, keepdim=True)
    else:
        probs = torch.softmax(logits, dim=-1)
    gate = _gates(probs, idx, k, renorm_top1=bug == "top1_renorm")

    # dispatch: kept assignments sorted by expert (so by destination rank), then token, then slot
    tok, slot = keep.nonzero(as_tuple=True)
    eid = idx[tok, slot]
    order = torch.argsort(eid * (idx.numel() + 1) + tok * k + slot)
    tok, slot, eid = tok[order], slot[order], eid[order]
    owner = torch.bucketize(eid, torch.tensor(split_offsets(n_experts, g_size)), right=True) - 1
    send_counts = torch.bincount(owner, minlength=g_size)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()
    recv_x = AllToAll.apply(x[tok], recv_splits, send_splits, group)
    meta = torch.stack([eid, tok + first_token], dim=1)
    recv_meta = meta.new_empty((sum(recv_splits), 2))
    dist.all_to_all_single(recv_meta, meta, recv_splits, send_splits, group=group)

    # the local experts
    routed = torch.zeros(len(w1s), n_tokens, dtype=torch.bool)
    if bug == "skip_empty_backward" and recv_x.shape[0] == 0:
        out = torch.zeros(0, d, dtype=x.dtype)  # "nothing to do": outside the autograd graph
    else:
        out = recv_x * 0  # keeps this rank in the backward all-to-alls even with no tokens
        for j, (w1, w2) in enumerate(zip(w1s, w2s)):
            target_id = j if bug == "expert_id_no_offset" else first_expert + j
            rows = (recv_meta[:, 0] == target_id).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue  # not run: its weights get no gradient
            routed[j, recv_meta[rows, 1]] = True
            out = out.index_add(0, rows, F.gelu(recv_x[rows] @ w1) @ w2)

    # combine
    back = AllToAll.apply(out, send_splits, recv_splits, group)
    y = torch.zeros(x.shape[0], d, dtype=x.dtype).index_add(0, tok, gate[tok, slot].unsqueeze(-1) * back)

    # aux loss: global counts before capacity, this rank's tokens' share of the mean probability
    counted = idx[keep] if bug == "aux_capacity_masked" else idx.reshape(-1)
    counts = all_reduce_by_all_to_all(torch.bincount(counted, minlength=n_experts), group, g_size)
    if bug == "logged_expert_counts":  # a load-balance log that sums the counts a second time
        logged = torch.bincount(counted, minlength=n_experts)
        dist.all_reduce(logged, group=group)
    aux = n_experts / (n_tokens * k) * (counts.to(x.dtype) * probs.sum(0) / n_tokens).sum()

    torch.autograd.backward([y, aux], [ctx.local["dy"], ctx.inputs["daux"]])

    experts = [w for pair in zip(w1s, w2s) for w in pair]
    if bug != "empty_expert_grad_none":
        for w in experts:
            if w.grad is None:  # an expert that got no tokens: zero gradient, still decayed
                w.grad = torch.zeros_like(w)
    grads = {
        name: torch.stack([w.grad if w.grad is not None else torch.zeros_like(w) for w in ws])
        if ws
        else ctx.local[src].clone()
        for name, ws, src in (("grad_w1", w1s, "w1"), ("grad_w2", w2s, "w2"))
    }
    if experts:
        torch.optim.SGD(experts, lr=LR, weight_decay=WEIGHT_DECAY, foreach=False).step()
    return {
        "y": y.detach(),
        "aux": aux.detach(),
        "grad_x": x.grad if x.grad is not None else torch.zeros_like(x),
        "grad_router": wr.grad,
        **grads,
        "w1_next": torch.stack([w.detach() for w in w1s]) if w1s else ctx.local["w1"].clone(),
        "w2_next": torch.stack([w.detach() for w in w2s]) if w2s else ctx.local["w2"].clone(),
        "routed": routed,
    }


# -- triggers ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _routed(case):
    """The global routing of a case (expert ids, capacity mask): shared by the triggers below."""
    return routing(inputs(case), case)


def _tie_decides(case) -> bool:
    """Bitwise-equal router logits at the top-k boundary: the tie decides which expert is chosen."""
    inp = inputs(case)
    k = _k(case)
    z = selection_logits(inp["x"], inp["wr"], inp["bias"], getattr(torch, case.dtype))
    if z.shape[1] <= k:
        return False
    ranked = torch.sort(z, dim=-1, descending=True).values
    return bool(((ranked[:, k - 1] == ranked[:, k]) & ranked[:, k].isfinite()).any())


def _expert_empty(case) -> bool:
    idx, keep = _routed(case)
    return case.sizes["experts"] >= 2 and len(set(idx[keep].tolist())) < case.sizes["experts"]


def _capacity_overflows(case) -> bool:
    _, keep = _routed(case)
    return not bool(keep.all())


def _rank_receives_nothing(case) -> bool:
    """A rank whose experts receive nothing while another rank's receive tokens (the hang trigger)."""
    idx, keep = _routed(case)
    sizes = split_sizes(case.sizes["experts"], case.group_size)
    owners = torch.repeat_interleave(torch.arange(case.group_size), torch.tensor(sizes))
    busy = set(owners[idx[keep]].tolist())
    return 0 < len(busy) < case.group_size


TRIGGERS = {
    "router tie decides": _tie_decides,
    "an expert receives no tokens": _expert_empty,
    "a capacity overflows": _capacity_overflows,
    "forced-empty experts": lambda c: c.options["empty_experts"] > 0 and c.sizes["experts"] > 2,
    "a rank holds no experts": lambda c: 0 in split_sizes(c.sizes["experts"], c.group_size),
    "a rank holds no tokens": lambda c: 0 in split_sizes(c.sizes["tokens"], c.group_size),
    "a rank receives nothing": _rank_receives_nothing,
    "top_k=1": lambda c: c.options["top_k"] == 1 and c.sizes["experts"] >= 2,
    "top_k>=2": lambda c: c.options["top_k"] >= 2 and c.sizes["experts"] >= 3,
}

GRADIENTS = ("grad_x", "grad_router", "grad_w1", "grad_w2")


# -- planted bugs ----------------------------------------------------------------------------------
def reference_comm(case) -> CommBudget:
    """Per rank, seven all-to-alls: the send counts (one int64 per rank), the kept assignments'
    token rows to the experts' ranks and back, forward and backward (``2 (S_out + S_in)`` rows of
    ``d``), their expert and token ids (two int64 per row sent) and the aux loss's expert counts
    (``n_experts`` int64 to every other rank). ``S_out``/``S_in``: rows this rank sends to / gets
    from the others, from the case's routing."""
    g, d, n_experts = case.group_size, case.sizes["d_model"], case.sizes["experts"]
    idx, keep = _routed(case)
    token_rank = torch.repeat_interleave(torch.arange(g), torch.tensor(split_sizes(idx.shape[0], g)))
    tok, slot = keep.nonzero(as_tuple=True)
    owner = torch.bucketize(idx[tok, slot], torch.tensor(split_offsets(n_experts, g)), right=True) - 1
    src = token_rank[tok]
    most = 0.0
    for r in range(g):
        s_out, s_in = int(((src == r) & (owner != r)).sum()), int(((owner == r) & (src != r)).sum())
        rows = 2 * (s_out + s_in) * d * ITEMSIZE[case.dtype]
        most = max(most, rows + 16 * s_out + 8 * (g - 1) * (1 + n_experts))
    why = "2 (S_out + S_in) token rows of d_model, 16 B of ids per row sent, (g - 1) (1 + experts) int64"
    return CommBudget(sent=most, collectives=7, why=why)


PLANTED = [
    PlantedBug(
        "logged_expert_counts",
        "the tokens-per-expert counts all-reduced a second time for a load-balance log (they were "
        "already summed for the aux loss): right values, one collective too many",
        Expect(kind="communication", world_size=1, mesh=(1,), uneven=None, note="any case"),
        p95=1,
    ),
    PlantedBug(
        "second_choice_slots",
        "second-choice capacity slots counted from 0, not after the first choices (GShard-style "
        "top-2 gating without `locations2 += sum(mask1)`), so second choices overflow the capacity "
        "(needs top_k >= 2 and a capacity that drops)",
        Expect(
            kind="mismatch",
            world_size=(1, 2),
            mesh=None,
            uneven=None,
            check=lambda c: c.options["top_k"] == 2 and c.options["capacity_factor"] is not None,
            note="top_k 2, a capacity that drops",
            needs=("top_k=2", "a capacity overflows"),
        ),
        p95=11,
    ),
    PlantedBug(
        "expert_id_no_offset",
        "received tokens matched to local experts by the global expert id, not shifted by the rank's "
        "first expert; rank 0 right (needs a second rank that holds experts)",
        Expect(
            kind="mismatch",
            world_size=(2,),
            mesh=None,
            uneven=None,
            check=lambda c: c.sizes["experts"] >= 2,
            note="2 experts",
        ),
        p95=1,
        link="flashinfer-ai/flashinfer#3547",
    ),
    PlantedBug(
        "empty_expert_grad_none",
        "an expert with no tokens keeps grad=None, so the optimizer skips its weight decay; gradients "
        "look right, only the weights after the step are wrong",
        Expect(
            kind="mismatch",
            world_size=(1, 2),
            mesh=None,
            uneven=None,
            outputs=("w1_next", "w2_next"),
            note="an empty expert",
        ),
        p95=1,
        link="NVIDIA-NeMo/Automodel#2995",
    ),
    PlantedBug(
        "top1_renorm",
        "top-1 gate renormalised to 1, so the router gets no gradient from the main loss (top_k=1 "
        "with a real choice between experts)",
        Expect(
            kind="mismatch",
            world_size=(1, 2),
            mesh=None,
            uneven=None,
            check=lambda c: c.options["top_k"] == 1 and c.sizes["experts"] >= 2,
            note="top_k 1, 2 experts",
        ),
        p95=2,
        link="jingyaogong/minimind#858",
    ),
    PlantedBug(
        "aux_capacity_masked",
        "aux loss counts the assignments left after capacity dropping (needs a capacity that drops "
        "something; not distributed)",
        Expect(
            kind="mismatch",
            world_size=(1, 2),
            mesh=None,
            uneven=None,
            check=lambda c: c.options["capacity_factor"] is not None,
            # the aux loss, and (seen by the tight bound) the gradients it reaches
            outputs=lambda outs: "aux" in outs and set(outs) <= {"aux", "grad_x", "grad_router"},
            note="a capacity that drops",
        ),
        p95=1,
        link="NVIDIA/Megatron-LM#1513",
    ),
    PlantedBug(
        "skip_empty_backward",
        "a rank that received no tokens leaves the autograd graph and skips the backward all-to-all; "
        "its peers hang (a rank that receives nothing, next to one that receives something)",
        # experts >= 2 by the strategy: the shrunk case has 2 or 3 experts on 2 ranks and 2 tokens,
        # whichever failing case Hypothesis shrinks from (the note said "1 expert", a size never drawn)
        Expect(
            kind="hang",
            world_size=(2,),
            mesh=None,
            uneven=None,
            timeout=2.0,
            note="a rank that receives no tokens",
        ),
        p95=1,
    ),
    PlantedBug(
        "bf16_exp2",
        "bf16 fast router softmax computes exp as exp2 without the log2(e) factor (gates, aux loss "
        "and router gradient off); fp32 and fp64 right",
        Expect(
            kind="mismatch",
            world_size=(1, 2),
            mesh=None,
            uneven=None,
            check=lambda c: c.dtype == "bfloat16",
            note="bfloat16",
        ),
        p95=1,
    ),
]

TARGET = Target(
    name="moe",
    description="MoE with expert parallelism: top-k routing, capacity, aux loss, all-to-all dispatch/combine",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs={
        "y": Shard(0),
        "aux": Partial(),
        "grad_x": Shard(0),
        "grad_router": Partial(),
        "grad_w1": Shard(0),
        "grad_w2": Shard(0),
        "w1_next": Shard(0),
        "w2_next": Shard(0),
        "routed": Shard(0),
    },
    input_layouts={"x": Shard(0), "dy": Shard(0), "w1": Shard(0), "w2": Shard(0)},
    implementations={"reference": "reference"},
    planted=PLANTED,
    triggers=TRIGGERS,
    gradients=GRADIENTS,
    comm={"reference": reference_comm},
)
