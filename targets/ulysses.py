"""Sequence-parallel attention, DeepSpeed-Ulysses style, with GQA and RoPE.

Each rank holds a slice of the sequence (``Shard(1, rule="tensor_split")``: the first ``seq % sp``
ranks get one extra token, as in Megatron-style hand-written code) with *all* heads. Per rank:

1. RoPE with the *global* positions of the local tokens (offset by the rank's sequence start);
2. one all-to-all for q, k and v together (``dist.all_to_all_single``, uneven splits) swaps
   sequence shards for head shards: every rank then holds the whole sequence for ``1/sp`` of the
   heads;
3. plain (causal or not: a drawn option) grouped-query attention on those heads;
4. a second all-to-all swaps back to sequence shards with all heads.

Backward is driven by a random cotangent; both all-to-alls go through one autograd Function
(:class:`shardfuzz.spec.parallel.AllToAll`, on flat buffers) whose backward is the reverse all-to-all.
Outputs compared: ``out``, ``grad_q``, ``grad_k``, ``grad_v`` (sequence-sharded like the inputs). At ``sp == 1`` the
all-to-alls are skipped (the identity), as most Ulysses implementations do.

Sizes the world size does not divide are *handled*, not left out (no ``supports`` rejection):

* sequence lengths: uneven ``tensor_split`` shards and uneven all-to-all splits;
* head counts: ``kv_heads`` (1-3) and ``q_per_kv`` (1-3, so ``heads = kv_heads * q_per_kv``) are
  drawn independently of the world size, so ``kv_heads < sp``, ``kv_heads % sp != 0`` and
  ``heads % sp != 0`` all occur. The reference pads the KV heads with zero heads to a multiple of
  ``sp`` and then the Q heads to ``padded_kv * q_per_kv`` (the fix of vllm-project/vllm-omni#5716),
  so every rank holds whole GQA groups; the padded heads' outputs are dropped. The generic
  "uneven" trigger counts only the sequence; head unevenness is counted by this target's declared
  triggers (``TRIGGERS``).

Planted bugs: the ``PLANTED`` records at the end of this file.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
import torch.nn.functional as F

import shardfuzz.strategies as sst
from shardfuzz import CommBudget, Expect, PlantedBug, Shard, Target
from shardfuzz.spec.budget import ITEMSIZE
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import split_offsets, split_sizes
from shardfuzz.spec.parallel import AllToAll

SEQ = Shard(1, rule="tensor_split")
ROPE_BASE = 10000.0

SIZES = {
    "batch": sst.Free(1, 2),
    "seq": sst.Split(min_per_rank=1, max_per_rank=3, min_size=2),  # one key: dq = dk = 0
    "kv_heads": sst.Free(1, 3),
    "q_per_kv": sst.Free(1, 3),
    "head_dim": sst.Free(1, 4),
}


def cases(world_sizes=None):
    return sst.cases("ulysses", sizes=SIZES, options={"causal": st.booleans()}, world_sizes=world_sizes)


def inputs(case):
    b, s, hkv, g, d = (case.sizes[k] for k in ("batch", "seq", "kv_heads", "q_per_kv", "head_dim"))
    gen = generator(case)
    return {
        "q": randn(case, b, s, hkv * g, d, gen=gen, role="logits"),
        "k": randn(case, b, s, hkv, d, gen=gen, role="logits"),
        "v": randn(case, b, s, hkv, d, gen=gen),
        "dout": randn(case, b, s, hkv * g, d, gen=gen, profile=False),
    }


# -- the math shared by the oracle and the ranks (dtype-generic) ---------------------------------
def rope(x, pos):
    """GPT-NeoX rotary embedding on the first ``2 * (d // 2)`` dims of ``x`` ``[b, s, h, d]`` at
    positions ``pos`` ``[s]`` (an odd last dim passes through: partial rotary)."""
    half = x.shape[-1] // 2
    if half == 0:
        return x
    inv_freq = ROPE_BASE ** (-torch.arange(half, dtype=torch.float64) / half)
    ang = pos.to(torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = (t.to(x.dtype)[None, :, None, :] for t in (ang.cos(), ang.sin()))
    x1, x2, rest = x[..., :half], x[..., half : 2 * half], x[..., 2 * half :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)


def causal_mask(nq, nk, shift=0):
    """``[nq, nk]`` bool, True where query ``i`` may see key ``j`` (``j <= i + shift``; 0:
    top-left aligned)."""
    return torch.ones(nq, nk, dtype=torch.bool).tril(shift)


def attention(q, k, v, causal, exp2=False, shift=0):
    """Grouped-query attention: ``q`` ``[b, s, hq, d]``, ``k``/``v`` ``[b, s, hkv, d]``; Q head ``j``
    uses KV head ``j * hkv // hq`` (``j // q_per_kv``). ``exp2``: the softmax's exp as exp2 without the log2(e) factor."""
    hq, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    kv_of = torch.arange(hq) * hkv // hq
    k, v = k[:, :, kv_of], v[:, :, kv_of]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * d**-0.5
    if causal:
        s = s.masked_fill(~causal_mask(s.shape[-2], s.shape[-1], shift), -torch.inf)
    if exp2:
        e = (s - s.amax(-1, keepdim=True).detach()).exp2()
        p = e / e.sum(-1, keepdim=True)
    else:
        p = torch.softmax(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


def oracle(inp, case):
    q, k, v = (inp[n].clone().requires_grad_() for n in ("q", "k", "v"))
    pos = torch.arange(q.shape[1])
    out = attention(rope(q, pos), rope(k, pos), v, case.options["causal"])
    out.backward(inp["dout"])
    return {"out": out, "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}


# -- the all-to-alls ----------------------------------------------------------------------------
def _grad_dtype(bug):
    """``bf16_grad_a2a``: "save bandwidth", gradients travel in bf16 whatever the run's dtype."""
    return torch.bfloat16 if bug == "bf16_grad_a2a" else None


def seq_to_heads(xs, seq_sizes, group, bug=None):
    """Tensors ``[b, s_r, H_t, d]`` (this rank's tokens, all heads) -> ``[b, s, H_t / sp, d]`` (all
    tokens, this rank's heads), in *one* all-to-all for all of them (q, k and v together)."""
    sp, (b, s_r, _, d) = len(seq_sizes), xs[0].shape
    if sp == 1:
        return list(xs)
    if bug == "separate_qkv_all_to_all" and len(xs) > 1:  # one all-to-all per tensor
        return [seq_to_heads([x], seq_sizes, group)[0] for x in xs]
    hls = [x.shape[2] // sp for x in xs]
    # per destination j: [b, s_r, heads of chunk j of each tensor, d], batch-first
    packed = torch.cat([x.reshape(b, s_r, sp, hl, d) for x, hl in zip(xs, hls)], dim=3)
    hl = sum(hls)
    send = packed.permute(2, 0, 1, 3, 4).reshape(-1)
    recv = [b * s_i * hl * d for s_i in seq_sizes]
    flat = AllToAll.apply(send, recv, [b * s_r * hl * d] * sp, group, _grad_dtype(bug))
    full = torch.cat([p.view(b, s_i, hl, d) for p, s_i in zip(flat.split(recv), seq_sizes)], dim=1)
    return list(full.split(hls, dim=2))


def heads_to_seq(y, seq_sizes, rank, group, bug=None):
    """``[b, s, H / sp, d]`` -> ``[b, s_r, H, d]``: the inverse of :func:`seq_to_heads`."""
    sp, (b, _, hl, d) = len(seq_sizes), y.shape
    if sp == 1:
        return y
    s_r = seq_sizes[rank]
    send_counts = [b * s_i * hl * d for s_i in seq_sizes]
    send = torch.cat([p.reshape(-1) for p in y.split(seq_sizes, dim=1)])
    flat = AllToAll.apply(send, [b * s_r * hl * d] * sp, send_counts, group, _grad_dtype(bug))
    if bug == "a2a_reshape":  # unpacked as seq-first, but the chunks were packed batch-first
        pieces = [p.view(s_r, b, hl, d).transpose(0, 1) for p in flat.chunk(sp)]
    else:
        pieces = [p.view(b, s_r, hl, d) for p in flat.chunk(sp)]
    return torch.cat(pieces, dim=2)


def pad_heads(x, h):
    """Append zero heads to ``x`` ``[b, s, heads, d]`` up to ``h`` heads."""
    return F.pad(x, (0, 0, 0, h - x.shape[2]))


def reference(ctx, *, bug: str | None = None):
    """Ulysses attention; ``bug`` plants one of the ``PLANTED`` bugs."""
    sp, r, group = ctx.group_size, ctx.group_rank, ctx.group
    n, hq, hkv = ctx.inputs["q"].shape[1], ctx.inputs["q"].shape[2], ctx.inputs["k"].shape[2]
    q, k, v = (ctx.local[name].clone().requires_grad_() for name in ("q", "k", "v"))
    seq_sizes = split_sizes(n, sp, SEQ.rule)
    start = split_offsets(n, sp, SEQ.rule)[r]
    s_r = q.shape[1]
    pos = torch.arange(s_r) if bug == "local_rope_positions" else torch.arange(start, start + s_r)
    qr, kr = rope(q, pos), rope(k, pos)
    # heads: pad KV to a multiple of sp, then Q to padded_kv * q_per_kv, so GQA groups stay whole
    kv_pad = -(-hkv // sp) * sp
    q_pad = -(-hq // sp) * sp if bug == "gqa_pad_separately" else kv_pad * (hq // hkv)
    kv = kr, v
    if bug == "kv_tiled_replicas" and hkv < sp and sp % hkv == 0 and hq % sp == 0:
        # the replication scheme (each KV head sp / kv_heads times, Q heads as they are), with
        # the replicas tiled (repeat: k0 k1 k0 k1) where GQA needs them interleaved (k0 k0 k1 k1)
        q_pad, kv = hq, tuple(x.repeat(1, 1, sp // hkv, 1) for x in kv)
    ql, kl, vl = seq_to_heads(
        [pad_heads(qr, q_pad), *(pad_heads(x, kv_pad) for x in kv)], seq_sizes, group, bug
    )
    exp2 = bug == "bf16_exp2" and q.dtype == torch.bfloat16  # the bf16 "fast kernel"
    # causal_bottom_right: K/V counted as padded to sp * ceil(n / sp), the causal mask aligned to
    # the bottom right as flash-attn >= 2.1 does when seqlen_k > seqlen_q: queries see the padding's
    # worth of future keys
    shift = -(-n // sp) * sp - n if bug == "causal_bottom_right" else 0
    ol = attention(ql, kl, vl, ctx.case.options["causal"], exp2, shift)
    out = heads_to_seq(ol, seq_sizes, r, group, bug)[:, :, :hq]
    out.backward(ctx.local["dout"])
    return {"out": out.detach(), "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}


GRADIENTS = ("grad_q", "grad_k", "grad_v")


def reference_comm(case) -> CommBudget:
    """Per rank, four all-to-alls (q, k, v to heads and back, and both backward), on the heads
    padded to whole GQA groups: rank ``r`` with ``s_r`` tokens sends
    ``b * d * (hl + hl_out) * (n + (sp - 2) s_r)`` elements, ``hl = (q_pad + 2 kv_pad) / sp``."""
    sp, n = case.group_size, case.sizes["seq"]
    if sp == 1:
        return CommBudget(sent=0, collectives=0, why="one rank: no all-to-all")
    b, d, hkv = case.sizes["batch"], case.sizes["head_dim"], case.sizes["kv_heads"]
    kv_pad = -(-hkv // sp) * sp
    q_pad = kv_pad * case.sizes["q_per_kv"]
    hl, hl_out = (q_pad + 2 * kv_pad) // sp, q_pad // sp
    most = max(b * d * (hl + hl_out) * (n + (sp - 2) * s_r) for s_r in split_sizes(n, sp, SEQ.rule))
    why = "4 all-to-alls of q/k/v (KV heads padded to a multiple of sp, Q to whole groups) and the output"
    return CommBudget(sent=most * ITEMSIZE[case.dtype], collectives=4, why=why)


def _q_heads(case):
    return case.sizes["kv_heads"] * case.sizes["q_per_kv"]


TRIGGERS = {
    "causal": lambda c: c.options["causal"],
    "causal on 4 ranks": lambda c: c.options["causal"] and c.group_size == 4,
    "kv_heads < sp with GQA": lambda c: c.sizes["kv_heads"] < c.group_size and c.sizes["q_per_kv"] > 1,
    "kv_heads % sp != 0 with kv_heads > sp": lambda c: (
        c.sizes["kv_heads"] > c.group_size > 1 and c.sizes["kv_heads"] % c.group_size
    ),
    "heads % sp != 0 on 3 ranks": lambda c: c.group_size == 3 and _q_heads(c) % 3,
    "odd head_dim (partial rotary)": lambda c: c.sizes["head_dim"] == 3,
}

PLANTED = [
    PlantedBug(
        "separate_qkv_all_to_all",
        "q, k and v each sent in an all-to-all of their own, forward and backward, where one packed "
        "all-to-all carries all three: right values and bytes, 4 collectives too many (4 alpha "
        "latencies per layer)",
        Expect(kind="communication", world_size=2, mesh=(2,), uneven=None, note="any case with 2 ranks"),
        p95=1,
    ),
    PlantedBug(
        "causal_bottom_right",
        "K/V padded to a multiple of sp and the causal mask aligned bottom-right (flash-attn >= 2.1's "
        "rule for seqlen_k > seqlen_q), so queries see future keys: right on even sequences and "
        "without causal (needs causal attention and an uneven sequence)",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=("seq",),
            check=lambda c: c.options["causal"],
            note="causal",
            needs=("causal", "uneven"),
        ),
        p95=1,
    ),
    PlantedBug(
        "a2a_reshape",
        "output all-to-all unpacked seq-first although packed batch-first; right at batch 1 "
        "(and with one token per rank; also deepspeedai/DeepSpeed#5808)",
        # seq 3 on 2 ranks is [2, 1]: rank 0 receives 2 tokens per chunk
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=("seq",),
            check=lambda c: c.sizes["batch"] == 2 and c.sizes["seq"] == 3,
            note="batch 2, seq 3",
        ),
        p95=1,
        link="deepspeedai/DeepSpeed#5664",
    ),
    PlantedBug(
        "local_rope_positions",
        "RoPE positions arange(local_len) instead of global; rank 0 is right, a head_dim of 1 has no rotary pair",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            check=lambda c: c.sizes["head_dim"] == 2 and c.sizes["seq"] == 2,
            note="seq 2, head_dim 2",
        ),
        p95=1,
        link="NVIDIA/Megatron-LM#453",
    ),
    PlantedBug(
        "gqa_pad_separately",
        "Q and KV heads padded to a multiple of sp separately, breaking the GQA ratio when "
        "kv_heads % sp != 0 (MHA unaffected)",
        # 1 KV head, 2 Q heads, sp 2
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            check=lambda c: c.sizes["kv_heads"] == 1 and c.sizes["q_per_kv"] == 2,
            note="1 KV head, 2 Q heads",
        ),
        p95=1,
        link="vllm-project/vllm-omni#5716",
    ),
    PlantedBug(
        "bf16_grad_a2a",
        "backward all-to-all sends gradients in bf16 (a gradient cast to a fixed dtype): wrong only in "
        "fp32/fp64 backward, and sp 1 has no all-to-all",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            check=lambda c: c.dtype == "float32",
            outputs=lambda outs: set(outs) <= set(GRADIENTS),
            note="float32",
        ),
        p95=1,
    ),
    PlantedBug(
        "bf16_exp2",
        "bf16 fast attention kernel computes the softmax's exp as exp2 without the log2(e) factor; "
        "fp32 and fp64 right",
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
        "kv_tiled_replicas",
        "fewer KV heads than ranks: each KV head replicated sp / kv_heads times (the DeepSpeed-Ulysses "
        "GQA scheme, as in PrimeIntellect-ai/prime-rl#3042) but tiled (repeat: k0 k1 k0 k1) where "
        "GQA's contiguous groups need them interleaved (k0 k0 k1 k1); right with one KV head, so it "
        "needs a group of 4 holding 2 KV heads (group%kv_heads==0)",
        Expect(
            kind="mismatch",
            world_size=4,
            mesh=(4,),
            uneven=None,
            check=lambda c: c.sizes["kv_heads"] == 2 and c.sizes["q_per_kv"] == 2,
            note="2 KV heads, 2 Q heads each",
            needs=("group%kv_heads==0",),
        ),
        p95=2,  # budget.py, 20 seeds: the covering row for group%kv_heads==0 (example 10 without per_group)
        link="apple/axlearn#842",
    ),
]

TARGET = Target(
    name="ulysses",
    description="DeepSpeed-Ulysses sequence parallel attention: all-to-all, GQA, global RoPE, causal option",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs={"out": SEQ, "grad_q": SEQ, "grad_k": SEQ, "grad_v": SEQ},
    input_layouts={"q": SEQ, "k": SEQ, "v": SEQ, "dout": SEQ},
    implementations={"reference": "reference"},
    planted=PLANTED,
    triggers=TRIGGERS,
    per_group={"kv_heads": "kv_heads"},  # KV heads against sequence-parallel ranks: fewer, replicated
    gradients=GRADIENTS,
    comm={"reference": reference_comm},
)
