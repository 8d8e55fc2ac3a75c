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
(:class:`AllToAll`) whose backward is the reverse all-to-all. Outputs compared: ``out``,
``grad_q``, ``grad_k``, ``grad_v`` (sequence-sharded like the inputs). At ``sp == 1`` the
all-to-alls are skipped (the identity), as most Ulysses implementations do.

Sizes the world size does not divide are *handled*, not left out (no ``supports`` rejection):

* sequence lengths: uneven ``tensor_split`` shards and uneven all-to-all splits;
* head counts: ``kv_heads`` (1-3) and ``q_per_kv`` (1-3, so ``heads = kv_heads * q_per_kv``) are
  drawn independently of the world size, so ``kv_heads < sp``, ``kv_heads % sp != 0`` and
  ``heads % sp != 0`` all occur. The reference pads the KV heads with zero heads to a multiple of
  ``sp`` and then the Q heads to ``padded_kv * q_per_kv`` (the fix of vllm-project/vllm-omni#5716),
  so every rank holds whole GQA groups; the padded heads' outputs are dropped. The statistics'
  "uneven" trigger counts only the sequence; head unevenness is reached by construction.

Planted bugs, each a small change to the reference modelled on a real one (BUG-PATTERNS.md):

* ``a2a_reshape``: the output all-to-all unpacks the received chunks as seq-first ``[s, b, ...]``
  although they were packed batch-first, scrambling tokens across the batch
  (deepspeedai/DeepSpeed#5664, #5808); right at batch 1 (and with one token per rank).
* ``local_rope_positions``: RoPE positions ``arange(local_len)`` instead of the global positions of
  the local shard (NVIDIA/Megatron-LM#453); rank 0 is right, and a head_dim of 1 has no rotary pair.
* ``gqa_pad_separately``: Q and KV heads are each padded to a multiple of ``sp`` on their own,
  which breaks the GQA ratio per rank when ``kv_heads % sp != 0`` (vllm-project/vllm-omni#5716);
  MHA (``q_per_kv == 1``) is unaffected.
* ``bf16_grad_a2a``: the backward all-to-all sends gradients in bfloat16 (a cast to a fixed dtype,
  BUG-PATTERNS "fp32 only, or bf16 only" / "a gradient cast to the wrong dtype"); the forward is
  right and bf16 runs cannot see it.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz.strategies as sst
from shardfuzz import Shard, Target
from shardfuzz.inputs import generator, randn
from shardfuzz.layouts import split_offsets, split_sizes

SEQ = Shard(1, rule="tensor_split")
ROPE_BASE = 10000.0

SIZES = {
    "batch": sst.Free(1, 2),
    "seq": sst.Split(min_per_rank=1, max_per_rank=3),
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
        "q": randn(case, b, s, hkv * g, d, gen=gen),
        "k": randn(case, b, s, hkv, d, gen=gen),
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


def causal_mask(nq, nk):
    """``[nq, nk]`` bool, True where query ``i`` may see key ``j`` (``j <= i``, top-left aligned)."""
    return torch.ones(nq, nk, dtype=torch.bool).tril()


def attention(q, k, v, causal):
    """Grouped-query attention: ``q`` ``[b, s, hq, d]``, ``k``/``v`` ``[b, s, hkv, d]``; Q head ``j``
    uses KV head ``j * hkv // hq`` (``j // q_per_kv``)."""
    hq, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    kv_of = torch.arange(hq) * hkv // hq
    k, v = k[:, :, kv_of], v[:, :, kv_of]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * d**-0.5
    if causal:
        s = s.masked_fill(~causal_mask(s.shape[-2], s.shape[-1]), -torch.inf)
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)


def oracle(inp, case):
    q, k, v = (inp[n].clone().requires_grad_() for n in ("q", "k", "v"))
    pos = torch.arange(q.shape[1])
    out = attention(rope(q, pos), rope(k, pos), v, case.options["causal"])
    out.backward(inp["dout"])
    return {"out": out, "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}


# -- magnitude-aware tolerance -------------------------------------------------------------------
def attention_magnitude(q, k, v, aq, ak, av, adout, mask, *, adlse=None, merge=False):
    """Elementwise bounds on the sum of |terms| behind attention's outputs and gradients.

    ``q``/``k``/``v`` ``[b, s, h, d]`` (float64, same heads) give the true probabilities ``P``;
    ``aq``/``ak``/``av``/``adout`` are bounds on the absolute values of the operands; ``mask``
    ``[nq, nk]`` (True: visible) or None. A rounding error in a score moves ``P`` by about
    ``P * (score error - mean score error)``, so ``P``'s relative error scales with the largest
    ``|q|.|k|`` term of the row (``E``); with ``merge`` (blockwise LSE merges), also with ``|lse|``.
    Returns bounds for ``out``, ``lse`` (``[b, h, s]``), ``dq``, ``dk`` and ``dv`` (per head of ``q``).
    """
    scale = q.shape[-1] ** -0.5
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    a = torch.einsum("bqhd,bkhd->bhqk", aq, ak) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -torch.inf)
        a = a.masked_fill(~mask, 0.0)
    lse = torch.logsumexp(s, dim=-1).nan_to_num(0.0, 0.0, 0.0)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    smax = a.amax(-1) if a.shape[-1] else torch.zeros_like(lse)
    e = 1.0 + 2.0 * smax + (2.0 * lse.abs() if merge else 0.0)  # [b, h, q]
    pe = p * e[..., None]
    out = torch.einsum("bhqk,bkhd->bqhd", pe, av)
    b_ = torch.einsum("bqhd,bkhd->bhqk", adout, av)  # |dout_i| . |v_j|
    dmag = (p * b_).sum(-1)
    if adlse is not None:
        dmag = dmag + adlse
    ds = pe * (b_ + dmag[..., None]) * 2.0
    return {
        "out": out,
        "lse": smax + lse.abs() + 1.0,
        "dq": torch.einsum("bhqk,bkhd->bqhd", ds, ak) * scale,
        "dk": torch.einsum("bhqk,bqhd->bkhd", ds, aq) * scale,
        "dv": torch.einsum("bhqk,bqhd->bkhd", pe, adout),
    }


def rope_abs(a):
    """A bound on ``|rope(x)|`` (and on ``|rope^T(g)|``) from ``a >= |x|``: each rotated pair gets
    ``|x1| + |x2|``."""
    half = a.shape[-1] // 2
    if half == 0:
        return a
    pair = a[..., :half] + a[..., half : 2 * half]
    return torch.cat([pair, pair, a[..., 2 * half :]], dim=-1)


def magnitude(inp, case):
    q, k, v, dout = (inp[n] for n in ("q", "k", "v", "dout"))
    n, hq, hkv = q.shape[1], q.shape[2], k.shape[2]
    kv_of = torch.arange(hq) * hkv // hq
    pos = torch.arange(n)
    qr, kr = rope(q, pos), rope(k, pos)[:, :, kv_of]
    aq, ak = rope_abs(q.abs()), rope_abs(k.abs())[:, :, kv_of]
    mask = causal_mask(n, n) if case.options["causal"] else None
    m = attention_magnitude(qr, kr, v[:, :, kv_of], aq, ak, v.abs()[:, :, kv_of], dout.abs(), mask)
    group = lambda t: torch.zeros_like(k).index_add_(2, kv_of, t)  # sum over each KV head's Q heads
    return {
        "out": m["out"],
        "grad_q": rope_abs(m["dq"]),
        "grad_k": rope_abs(group(m["dk"])),
        "grad_v": group(m["dv"]),
    }


# -- the all-to-all, inside autograd -------------------------------------------------------------
class AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` on flat buffers with (uneven) element counts; backward is the
    reverse all-to-all."""

    @staticmethod
    def forward(ctx, x, send, recv, group, bf16_grad_bug=False):
        ctx.send, ctx.recv, ctx.group, ctx.bf16_grad_bug = send, recv, group, bf16_grad_bug
        out = x.new_empty(sum(recv))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        dtype = grad.dtype
        if ctx.bf16_grad_bug:  # "save bandwidth": gradients travel in bf16 whatever the run's dtype
            grad = grad.to(torch.bfloat16)
        out = grad.new_empty(sum(ctx.send))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out.to(dtype), None, None, None, None


def seq_to_heads(xs, seq_sizes, group, bug=None):
    """Tensors ``[b, s_r, H_t, d]`` (this rank's tokens, all heads) -> ``[b, s, H_t / sp, d]`` (all
    tokens, this rank's heads), in *one* all-to-all for all of them (q, k and v together)."""
    sp, (b, s_r, _, d) = len(seq_sizes), xs[0].shape
    if sp == 1:
        return list(xs)
    hls = [x.shape[2] // sp for x in xs]
    # per destination j: [b, s_r, heads of chunk j of each tensor, d], batch-first
    packed = torch.cat([x.reshape(b, s_r, sp, hl, d) for x, hl in zip(xs, hls)], dim=3)
    hl = sum(hls)
    send = packed.permute(2, 0, 1, 3, 4).reshape(-1)
    recv = [b * s_i * hl * d for s_i in seq_sizes]
    flat = AllToAll.apply(send, [b * s_r * hl * d] * sp, recv, group, bug == "bf16_grad_a2a")
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
    flat = AllToAll.apply(send, send_counts, [b * s_r * hl * d] * sp, group, bug == "bf16_grad_a2a")
    if bug == "a2a_reshape":  # unpacked as seq-first, but the chunks were packed batch-first
        pieces = [p.view(s_r, b, hl, d).transpose(0, 1) for p in flat.chunk(sp)]
    else:
        pieces = [p.view(b, s_r, hl, d) for p in flat.chunk(sp)]
    return torch.cat(pieces, dim=2)


def pad_heads(x, h):
    """Append zero heads to ``x`` ``[b, s, heads, d]`` up to ``h`` heads."""
    return F.pad(x, (0, 0, 0, h - x.shape[2]))


def _run(ctx, bug=None):
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
    ql, kl, vl = seq_to_heads(
        [pad_heads(qr, q_pad), pad_heads(kr, kv_pad), pad_heads(v, kv_pad)], seq_sizes, group, bug
    )
    ol = attention(ql, kl, vl, ctx.case.options["causal"])
    out = heads_to_seq(ol, seq_sizes, r, group, bug)[:, :, :hq]
    out.backward(ctx.local["dout"])
    return {"out": out.detach(), "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}


def reference(ctx):
    return _run(ctx)


def a2a_reshape(ctx):
    return _run(ctx, "a2a_reshape")


def local_rope_positions(ctx):
    return _run(ctx, "local_rope_positions")


def gqa_pad_separately(ctx):
    return _run(ctx, "gqa_pad_separately")


def bf16_grad_a2a(ctx):
    return _run(ctx, "bf16_grad_a2a")


PLANTED = {
    "a2a_reshape": "output all-to-all unpacked seq-first although packed batch-first; right at batch 1 "
    "(deepspeedai/DeepSpeed#5664, #5808)",
    "local_rope_positions": "RoPE positions arange(local_len) instead of global; rank 0 is right "
    "(NVIDIA/Megatron-LM#453)",
    "gqa_pad_separately": "Q and KV heads padded to a multiple of sp separately, breaking the GQA ratio "
    "when kv_heads % sp != 0 (vllm-project/vllm-omni#5716)",
    "bf16_grad_a2a": "backward all-to-all sends gradients in bf16: wrong only in fp32/fp64 backward "
    "(a gradient cast to a fixed dtype)",
}

TARGET = Target(
    name="ulysses",
    description="DeepSpeed-Ulysses sequence parallel attention: all-to-all, GQA, global RoPE, causal option",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    magnitude=magnitude,
    outputs={"out": SEQ, "grad_q": SEQ, "grad_k": SEQ, "grad_v": SEQ},
    input_layouts={"q": SEQ, "k": SEQ, "v": SEQ, "dout": SEQ},
    implementations={"reference": "reference", **{name: name for name in PLANTED}},
    planted=PLANTED,
)
