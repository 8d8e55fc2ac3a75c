"""Top-1 MoE with renormalised gates and expert parallelism, forward and backward.

Tokens ``x: [tokens, d_model]`` are sharded over the group (``Shard(0)``, DTensor's rule); the
experts (GELU MLPs ``w1: [experts, d_model, hidden]``, ``w2: [experts, hidden, d_model]``) are
spread over the ranks in contiguous blocks (``Shard(0)``: a rank may hold none); the router
``router: [experts, d_model]`` is replicated (Megatron's ``f``: its gradient is all-reduced).

Each token goes to the expert with the largest router logit (decided in float64, the same way in
the oracle and on every rank; a tie goes to the lower expert id). Its gate is the softmax
probability of that expert renormalised over the chosen experts, ``p / p.sum()``: exactly 1 for
top-1, so the router gets no gradient from the output (jingyaogong/minimind#858). The router
gradient is therefore 0 in exact arithmetic, and what the oracle and the ranks compute for it is
rounding noise around 0 (about 1e-17 in float64, far more in bfloat16).

Dispatch: the local tokens are sorted by expert (so by owner rank) and sent with an uneven
all-to-all (``shardfuzz.spec.parallel.AllToAll``: its backward is the reverse all-to-all); the experts
run on what they received; the combine is the reverse all-to-all, the gate and the un-sorting.

Planted bugs: ``expert_id_no_offset`` (a rank matches its local expert ``j`` against global id
``j``: right on rank 0 only) and ``missing_unpermute`` (the combined rows are left in expert order:
right while each rank's tokens already come in expert order).
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz
import shardfuzz.strategies as sst
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets, split_sizes
from shardfuzz.spec.parallel import AllToAll, CopyToGroup


def inputs(case):
    t, e, d, h = (case.sizes[k] for k in ("tokens", "experts", "d_model", "hidden"))
    g = generator(case)
    return {
        "x": randn(case, t, d, gen=g),
        "router": randn(case, e, d, gen=g, role="weight", scale=d**-0.5),
        "w1": randn(case, e, d, h, gen=g, role="weight", scale=d**-0.5),
        "w2": randn(case, e, h, d, gen=g, role="weight", scale=h**-0.5),
        "dy": randn(case, t, d, gen=g, profile=False),
    }


@shardfuzz.decision()  # the oracle and every rank call it on the same values: exact on both sides
def choose_expert(x, router):
    """Top-1 expert ids, from float64 logits made by elementwise ops (the same bits for a token
    whatever the batch around it); ``argmax`` gives a tie to the lower id."""
    return (x.detach().double()[:, None, :] * router.detach().double()).sum(-1).argmax(-1)


def top1_gate(x, router, idx):
    probs = torch.softmax(F.linear(x, router), dim=-1)
    top = probs.gather(1, idx[:, None])
    return top / top.sum(-1, keepdim=True)  # renormalised over the chosen (one) expert: 1


def expert_mlp(x, w1, w2):
    return F.gelu(x @ w1) @ w2


def oracle(inp, case):
    x, router, w1, w2 = (inp[k].clone().requires_grad_() for k in ("x", "router", "w1", "w2"))
    idx = choose_expert(x, router)
    hidden = F.gelu(torch.einsum("td,tdh->th", x, w1[idx]))
    y = top1_gate(x, router, idx) * torch.einsum("th,thd->td", hidden, w2[idx])
    y.backward(inp["dy"])
    return {
        "y": y.detach(),
        "grad_x": x.grad,
        "grad_router": router.grad,
        "grad_w1": w1.grad,
        "grad_w2": w2.grad,
    }


def expert_parallel_moe(ctx, *, expert_offset=True, unpermute=True):
    group, rank, size = ctx.group, ctx.group_rank, ctx.group_size
    n_experts = ctx.inputs["router"].shape[0]
    x = ctx.local["x"].clone().requires_grad_()
    router_leaf = ctx.inputs["router"].clone().requires_grad_()
    w1, w2 = (ctx.local[k].clone().requires_grad_() for k in ("w1", "w2"))  # this rank's experts
    router = CopyToGroup.apply(router_leaf, group)

    idx = choose_expert(x, router)
    gate = top1_gate(x, router, idx)

    # dispatch: sort the local tokens by expert, so by the rank that owns it
    order = torch.argsort(idx, stable=True)
    owner_of_expert = torch.repeat_interleave(torch.arange(size), torch.tensor(split_sizes(n_experts, size)))
    send = torch.bincount(owner_of_expert[idx], minlength=size)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    send_splits, recv_splits = send.tolist(), recv.tolist()
    recv_x = AllToAll.apply(x[order], recv_splits, send_splits, group)
    recv_expert = idx.new_empty(sum(recv_splits))
    dist.all_to_all_single(recv_expert, idx[order], recv_splits, send_splits, group=group)

    # the local experts (recv_x * 0 keeps a rank that received nothing in the backward all-to-all)
    out = recv_x * 0
    first = split_offsets(n_experts, size)[rank]
    for j in range(w1.shape[0]):
        rows = (recv_expert == (first + j if expert_offset else j)).nonzero()[:, 0]
        out = out.index_add(0, rows, expert_mlp(recv_x[rows], w1[j], w2[j]))

    # combine: send the results home, undo the sort, apply the gate
    back = AllToAll.apply(out, send_splits, recv_splits, group)
    y_sorted = gate[order] * back
    y = torch.zeros_like(y_sorted).index_copy(0, order, y_sorted) if unpermute else y_sorted
    y.backward(ctx.local["dy"])
    return {
        "y": y.detach(),
        "grad_x": grad_or_zeros(x),
        "grad_router": grad_or_zeros(router_leaf),
        "grad_w1": grad_or_zeros(w1),
        "grad_w2": grad_or_zeros(w2),
    }


def grad_or_zeros(t):
    """A rank with no tokens or no experts leaves some leaves out of the graph: their gradient is 0."""
    return t.grad if t.grad is not None else torch.zeros_like(t)


def reference(ctx):
    return expert_parallel_moe(ctx)


def expert_id_no_offset(ctx):  # planted: experts on ranks >= 1 never find their tokens
    return expert_parallel_moe(ctx, expert_offset=False)


def missing_unpermute(ctx):  # planted: outputs stay in expert order
    return expert_parallel_moe(ctx, unpermute=False)


TARGET = shardfuzz.Target(
    name="moe_top1",
    description="expert-parallel top-1 MoE with renormalised gates (router gradient 0), forward and backward",
    cases=lambda world_sizes=None: sst.cases(
        "moe_top1",
        sizes={
            "tokens": sst.Split(min_per_rank=1, max_per_rank=3),
            "experts": sst.Split(min_per_rank=0, max_per_rank=2, allow_empty=True),
            "d_model": sst.Free(1, 4),
            "hidden": sst.Free(1, 3),
        },
        world_sizes=world_sizes,
    ),
    inputs=inputs,
    oracle=oracle,
    input_layouts={
        "x": shardfuzz.Shard(0),
        "dy": shardfuzz.Shard(0),
        "w1": shardfuzz.Shard(0),
        "w2": shardfuzz.Shard(0),
    },
    outputs={
        "y": shardfuzz.Shard(0),
        "grad_x": shardfuzz.Shard(0),
        "grad_router": shardfuzz.Replicate(),
        "grad_w1": shardfuzz.Shard(0),
        "grad_w2": shardfuzz.Shard(0),
    },
    implementations={
        "reference": reference,
        "expert_id_no_offset": expert_id_no_offset,
        "missing_unpermute": missing_unpermute,
    },
    gradients=("grad_x", "grad_router", "grad_w1", "grad_w2"),
)
