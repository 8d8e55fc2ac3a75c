"""Ring attention: blockwise attention with K/V passed around the ring and an LSE merge.

Each rank holds a slice of the sequence of ``q``, ``k`` and ``v`` ``[b, s, h, d]``. For ``sp`` steps
it attends its queries to the K/V block it holds, merges the partial result into its running
output by the blocks' log-sum-exp (numerically stable: ``new = logaddexp(lse, lse_b)``, i.e.
``max + log(exp(lse - max) + exp(lse_b - max))``, and each part rescaled by ``exp(its lse - new)``,
which keeps a tiny result's relative accuracy; the sigmoid form ``out -= sigmoid(lse_b - lse) *
(out - out_b)`` of ring-flash-attention loses it to cancellation), and
passes the K/V block to the next rank (``dist.batch_isend_irecv``; blocks are padded to the
longest one, so uneven and empty shards travel too). Three variants (option ``variant``):

* ``full``: non-causal, every block on every step; sequence ``Shard(1)`` (DTensor rule: uneven
  lengths can leave a rank with no tokens);
* ``causal``: the diagonal step is causal, blocks from earlier ranks are attended in full and
  blocks from later ranks skipped; ``Shard(1)``;
* ``zigzag``: load-balanced causal (ring-flash-attention's zigzag): the sequence in the
  ``Zigzag(1)`` layout (rank ``r`` holds chunks ``r`` and ``2 sp - 1 - r``); off the diagonal, a
  block from an earlier rank is attended by all local queries with only its first chunk, a block
  from a later rank by the second local chunk only.

Forward and backward live in one autograd Function (:class:`RingAttention`); the backward is an
explicit second ring (flash-attention's recomputation with the saved output and LSE) in which the
dK/dV accumulators travel with their K/V block and take one last hop home. The inputs are
upcast to float32 (float64 stays) for the blockwise math, as flash-attention accumulates, and the
results cast back; the LSE stays in that precision. Backward is driven by random cotangents for
both the output and the LSE.

Outputs: ``out``, ``lse`` (``[b, h, s]``, compared absolutely in log space)
and ``grad_q``/``grad_k``/``grad_v``, in the case's layout (:func:`outputs`): ``Shard`` for the
``full`` and ``causal`` variants, ``Zigzag`` for ``zigzag``.

Value-dependent trigger: option ``logit_scale`` (1, 30 or 100) multiplies ``q``, giving logit gaps
of hundreds between the blocks' LSEs (drawn, not left to seed luck).

Planted bugs: the ``PLANTED`` records at the end of this file.
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st
import torch
import torch.distributed as dist
import torch.nn.functional as F

import shardfuzz.strategies as sst
from shardfuzz import CommBudget, Expect, ExpectedFailure, PlantedBug, Shard, Target, Verified, bind
from shardfuzz.frontends.testing import uneven_sizes
from shardfuzz.spec.budget import ITEMSIZE
from shardfuzz.spec.inputs import generator, randn
from shardfuzz.spec.layouts import Zigzag, split_sizes

VARIANTS = ("full", "causal", "zigzag")
#: (sequence dim of [b, s, h, d] tensors, of the [b, h, s] LSE) per layout
LAYOUTS = {"shard": (Shard(1), Shard(2)), "zigzag": (Zigzag(1), Zigzag(2))}

SIZES = {
    "batch": sst.Free(1, 2),
    "seq": sst.Split(
        min_per_rank=1, max_per_rank=3, min_size=2
    ),  # one key: dq = dk = 0 without an LSE gradient
    "heads": sst.Free(1, 2),
    "head_dim": sst.Free(1, 4),
}


def cases(world_sizes=None):
    return sst.cases(
        "ring_attention",
        sizes=SIZES,
        options={
            "variant": st.sampled_from(VARIANTS),
            # False: no gradient flows into the LSE output (torch's and flash-attn's rings take
            # none); the LSE is still compared
            "lse_grad": st.sampled_from([True, False]),
            # large logit gaps saturate the softmax, which hides most bugs: rare at random, and
            # every value still meets every other condition in the covering rows
            "logit_scale": sst.mostly(1.0, 30.0, 100.0),
        },
        world_sizes=world_sizes,
    )


def layout_of(case):
    return "zigzag" if case.options["variant"] == "zigzag" else "shard"


def outputs(case):
    """The outputs and their layouts: the sequence dim in the case's layout."""
    seq, seq_lse = LAYOUTS[layout_of(case)]
    return {"out": seq, "lse": seq_lse, "grad_q": seq, "grad_k": seq, "grad_v": seq}


def inputs(case):
    b, s, h, d = (case.sizes[k] for k in ("batch", "seq", "heads", "head_dim"))
    g = generator(case)
    return {
        "q": randn(case, b, s, h, d, gen=g, scale=case.options["logit_scale"], role="logits"),
        "k": randn(case, b, s, h, d, gen=g, role="logits"),
        "v": randn(case, b, s, h, d, gen=g),
        "dout": randn(case, b, s, h, d, gen=g, profile=False),
        "dlse": randn(case, b, h, s, gen=g, profile=False) * float(case.options.get("lse_grad", True)),
    }


def _stat_dtype(dtype):
    """The precision of the blockwise math and of the LSE: float32, or float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def causal_mask(nq, nk):
    """``[nq, nk]`` bool, True where query ``i`` may see key ``j`` (``j <= i``, top-left aligned)."""
    return torch.ones(nq, nk, dtype=torch.bool).tril()


def oracle(inp, case):
    q, k, v = (inp[n].clone().requires_grad_() for n in ("q", "k", "v"))
    n = q.shape[1]
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if case.options["variant"] != "full":
        s = s.masked_fill(~causal_mask(n, n), -torch.inf)
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v)
    lse = lse.to(_stat_dtype(q.dtype))
    torch.autograd.backward([out, lse], [inp["dout"], inp["dlse"].to(lse.dtype)])
    return {"out": out, "lse": lse, "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}


# -- the ring ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Ring:
    """This rank's place in the ring and the block lengths of every rank."""

    group: object
    rank: int
    size: int
    variant: str
    lens: list  # local sequence length of every group rank
    first: list  # length of the first zigzag chunk of every group rank (zigzag only)
    bug: str | None = None

    @property
    def maxlen(self):
        if self.bug == "pad_to_full_sequence":  # right values, every message the whole sequence long
            return sum(self.lens)
        return max(self.lens)

    def source(self, step):
        """The group rank whose K/V block this rank holds at ``step``."""
        return (self.rank - step) % self.size

    def blocks(self, step, src):
        """``(q_start, k_stop, causal)`` of the pieces to compute at ``step`` with ``src``'s block:
        local queries ``[q_start:]`` against the block's keys ``[:k_stop]``."""
        k_all = self.lens[src]
        if self.variant == "full":  # unmasked_padding: the padded length, zero keys included
            return [(0, self.maxlen if self.bug == "unmasked_padding" else k_all, False)]
        if step == 0:
            return [(0, k_all, True)]
        every = self.bug == "causal_every_step"
        if self.variant == "causal":
            return [(0, k_all, every)] if src < self.rank else []
        earlier = src > self.rank if self.bug == "zigzag_inverted_branch" else src < self.rank
        if earlier:  # all local queries see the block's first chunk; its second chunk is later
            return [(0, self.first[src], every)]
        return [(self.first[self.rank], k_all, every)]  # only the second local chunk sees the block

    def pad(self, t):
        """``t`` ``[b, <=maxlen, h, d]`` padded with zero rows to ``maxlen``."""
        return F.pad(t, (0, 0, 0, 0, 0, self.maxlen - t.shape[1]))

    def pass_on(self, tensors):
        """Send ``tensors`` (``[b, <=maxlen, h, d]``, padded to ``maxlen``) to the next rank and
        receive the previous rank's: one batched isend/irecv."""
        send = torch.stack([self.pad(t) for t in tensors])
        recv = torch.empty_like(send)
        nxt, prv = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        if self.bug == "reversed_ring":
            nxt, prv = prv, nxt
        ops = [
            dist.P2POp(dist.isend, send, group=self.group, group_peer=nxt),
            dist.P2POp(dist.irecv, recv, group=self.group, group_peer=prv),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return list(recv.unbind(0))


def _scores(q, k, causal):
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(~causal_mask(s.shape[-2], s.shape[-1]), -torch.inf)
    return s


def _block(s, v, exp2=False):
    """One block's ``(out, lse)`` from scores ``s`` ``[b, h, q, k]`` and values ``v``."""
    if exp2:  # bf16_exp2: exp2 without the log2(e) factor (the backward keeps exp)
        m = s.amax(-1, keepdim=True)
        e = (s - m).exp2()
        total = e.sum(-1, keepdim=True)
        return torch.einsum("bhqk,bkhd->bqhd", e / total, v), (m + total.log()).squeeze(-1)
    lse = torch.logsumexp(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - lse[..., None]), v), lse


def _merge(out, lse, b_out, b_lse, naive=False):
    """Merge a block's ``(out, lse)`` into the running ones (``out`` ``[b, q, h, d]``, ``lse``
    ``[b, h, q]``): ``new = logaddexp(lse, lse_b)`` (max-subtracted, so it cannot overflow), then
    each part rescaled by ``exp(its lse - new) <= 1``."""
    if naive:  # ring-flash-attention before 9b84a6a: exp overflows for gaps > ~88 in float32
        new = lse + torch.log(1 + torch.exp(b_lse - lse))
    else:
        new = torch.logaddexp(lse, b_lse)
    w_old, w_new = (torch.exp(t - new).transpose(1, 2)[..., None] for t in (lse, b_lse))
    return w_old * out + w_new * b_out, new


def _ring_forward(q, k, v, ring, exp2=False):
    b, nq, h, _ = q.shape
    out, lse = torch.zeros_like(q), q.new_zeros(b, h, nq)
    started = False
    kbuf, vbuf = ring.pad(k), ring.pad(v)
    for step in range(ring.size):
        src = ring.source(step)
        for q0, k1, causal in ring.blocks(step, src):
            if q0 >= nq or k1 == 0:
                continue
            b_out, b_lse = _block(_scores(q[:, q0:], kbuf[:, :k1], causal), vbuf[:, :k1], exp2)
            if not started:  # the diagonal block comes first and covers every local query
                out, lse, started = b_out, b_lse, True
            else:
                out[:, q0:], lse[:, :, q0:] = _merge(
                    out[:, q0:], lse[:, :, q0:], b_out, b_lse, ring.bug == "naive_merge"
                )
        if step + 1 < ring.size:
            kbuf, vbuf = ring.pass_on([kbuf, vbuf])
    return out, lse


def _ring_backward(dout, dlse, q, k, v, out, lse, ring):
    nq = q.shape[1]
    delta = (dout * out).sum(-1).transpose(1, 2) - dlse  # [b, h, q]: rowsum(dO * O) - dLSE
    dq = torch.zeros_like(q)
    kbuf, vbuf = ring.pad(k), ring.pad(v)
    dkbuf, dvbuf = torch.zeros_like(kbuf), torch.zeros_like(vbuf)  # travel with their block
    for step in range(ring.size):
        src = ring.source(step)
        for q0, k1, causal in ring.blocks(step, src):
            if q0 >= nq or k1 == 0:
                continue
            qb, kb, vb, dob = q[:, q0:], kbuf[:, :k1], vbuf[:, :k1], dout[:, q0:]
            p = torch.exp(_scores(qb, kb, causal) - lse[:, :, q0:, None])
            dvbuf[:, :k1] += torch.einsum("bhqk,bqhd->bkhd", p, dob)
            dp = torch.einsum("bqhd,bkhd->bhqk", dob, vb)
            ds = p * (dp - delta[:, :, q0:, None]) * q.shape[-1] ** -0.5
            dq[:, q0:] += torch.einsum("bhqk,bkhd->bqhd", ds, kb)
            dkbuf[:, :k1] += torch.einsum("bhqk,bqhd->bkhd", ds, qb)
        if step + 1 < ring.size:
            nk, nv, dkbuf, dvbuf = ring.pass_on([kbuf, vbuf, dkbuf, dvbuf])
            if ring.bug != "stale_kv_backward":
                kbuf, vbuf = nk, nv
    if ring.size > 1:  # the accumulators of block rank+1 are complete here: one last hop home
        dkbuf, dvbuf = ring.pass_on([dkbuf, dvbuf])
    n_own = k.shape[1]
    return dq, dkbuf[:, :n_own], dvbuf[:, :n_own]


class RingAttention(torch.autograd.Function):
    """Ring attention forward and backward; returns ``(out, lse)``."""

    @staticmethod
    def forward(ctx, q, k, v, ring):
        dtype, stat = q.dtype, _stat_dtype(q.dtype)
        q32, k32, v32 = (t.to(stat) for t in (q, k, v))
        exp2 = ring.bug == "bf16_exp2" and dtype == torch.bfloat16  # the bf16 "fast kernel"
        out, lse = _ring_forward(q32, k32, v32, ring, exp2)
        ctx.save_for_backward(q32, k32, v32, out, lse)
        ctx.ring, ctx.dtype = ring, dtype
        return out.to(dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout.to(q.dtype), dlse.to(q.dtype), q, k, v, out, lse, ctx.ring)
        return dq.to(ctx.dtype), dk.to(ctx.dtype), dv.to(ctx.dtype), None


def block_lengths(case):
    """Every rank's local sequence length, and the Zigzag layout's chunks."""
    n, sp = case.sizes["seq"], case.group_size
    chunks = split_sizes(n, 2 * sp, "tensor_split")
    if layout_of(case) == "zigzag":
        return [chunks[r] + chunks[2 * sp - 1 - r] for r in range(sp)], chunks
    return split_sizes(n, sp, "dtensor"), chunks


def reference(ctx, *, bug: str | None = None):
    """Ring attention in the case's variant; ``bug`` plants one of the ``PLANTED`` bugs."""
    variant = ctx.case.options["variant"]
    seq, seq_lse = LAYOUTS[layout_of(ctx.case)]
    sp = ctx.group_size
    q, k, v = (ctx.shard(ctx.inputs[name], seq).clone().requires_grad_() for name in ("q", "k", "v"))
    lens, chunks = block_lengths(ctx.case)
    ring = Ring(ctx.group, ctx.group_rank, sp, variant, lens, chunks[:sp], bug)
    out, lse = RingAttention.apply(q, k, v, ring)
    dout, dlse = ctx.shard(ctx.inputs["dout"], seq), ctx.shard(ctx.inputs["dlse"], seq_lse)
    torch.autograd.backward([out, lse], [dout, dlse.to(lse.dtype)])
    return {"out": out.detach(), "lse": lse.detach(), "grad_q": q.grad, "grad_k": k.grad, "grad_v": v.grad}


GRADIENTS = ("grad_q", "grad_k", "grad_v")


def reference_comm(case) -> CommBudget:
    """Per rank: ``sp - 1`` forward hops of the K/V block, ``sp - 1`` backward hops of K/V with
    their dK/dV accumulators and one last hop home of dK/dV, each block padded to the longest
    shard, in the blockwise precision (float32, float64 for float64)."""
    sp = case.group_size
    if sp == 1:
        return CommBudget(sent=0, collectives=0, why="one rank: no ring")
    b, h, d = (case.sizes[k] for k in ("batch", "heads", "head_dim"))
    block = b * max(block_lengths(case)[0]) * h * d
    item = ITEMSIZE[str(_stat_dtype(getattr(torch, case.dtype))).removeprefix("torch.")]
    why = "(2 (sp-1) + 4 (sp-1) + 2) x batch*max_len*heads*head_dim elements sent in 2 sp - 1 hops"
    return CommBudget(sent=item * block * (6 * (sp - 1) + 2), collectives=2 * (2 * sp - 1), why=why)


def _variant(case):
    return case.options["variant"]


TRIGGERS = {
    **{f"variant={v}": (lambda c, v=v: _variant(c) == v) for v in VARIANTS},
    "causal on exactly 3 ranks": lambda c: _variant(c) == "causal" and c.world_size == 3,
    "non-causal on an uneven sequence": lambda c: (
        _variant(c) == "full" and c.sizes["seq"] % c.group_size != 0
    ),
    "zigzag on 3 ranks": lambda c: _variant(c) == "zigzag" and c.world_size == 3,
    "zigzag on 4 ranks": lambda c: _variant(c) == "zigzag" and c.world_size == 4,
    "causal with an empty DTensor shard": lambda c: (
        _variant(c) == "causal" and 0 in split_sizes(c.sizes["seq"], c.group_size)
    ),
    "an empty zigzag chunk": lambda c: _variant(c) == "zigzag" and c.sizes["seq"] < 2 * c.group_size,
    # each rank's block is cut in two halves by a zigzag layout: one token cannot be
    "zigzag, one token per rank": lambda c: _variant(c) == "zigzag" and c.sizes["seq"] == c.group_size >= 2,
    "logit_scale>1": lambda c: c.options["logit_scale"] > 1,
    "logit gap: logit_scale 100 on 3 ranks": lambda c: c.options["logit_scale"] == 100 and c.group_size == 3,
}

PLANTED = [
    PlantedBug(
        "pad_to_full_sequence",
        "every K/V block padded to the whole sequence, not to the longest shard, before it travels: "
        "right values, sp times the bytes",
        Expect(kind="communication", world_size=2, mesh=(2,), uneven=None, note="any case with 2 ranks"),
        p95=1,
    ),
    PlantedBug(
        "unmasked_padding",
        "non-causal path attends over the padded K/V block (zero keys unmasked, weight exp(-lse)); "
        "the causal paths slice by the real length (needs an uneven sequence and non-causal "
        "attention at once; a saturated softmax would hide it)",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=("seq",),
            check=lambda c: _variant(c) == "full",
            note="non-causal, uneven seq",
            needs=("uneven", "variant='full'"),
        ),
        p95=3,
    ),
    PlantedBug(
        "naive_merge",
        "LSE merge log(1 + exp(lse_b - lse)) overflows in float32 for logit gaps above ~88",
        # a large logit gap between the blocks' LSEs (a drawn logit_scale)
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=None,  # needs neither: the gap decides, and shrinking may end on either
            check=lambda c: _variant(c) == "full" and c.options["logit_scale"] > 1,
            note="logit_scale 30",
        ),
        p95=7,
        link="zhuzilin/ring-flash-attention@9b84a6a",
    ),
    PlantedBug(
        "causal_every_step",
        "causal mask applied on every ring step, not only the diagonal one",
        # the off-diagonal block must be wider than one key: seq 3 on 2 ranks is [2, 1]
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            uneven=("seq",),
            check=lambda c: _variant(c) == "causal" and c.sizes["seq"] == 3,
            note="causal, seq 3",
        ),
        p95=2,
        link="zhuzilin/ring-flash-attention@4072701",
    ),
    PlantedBug(
        "zigzag_inverted_branch",
        "zigzag test for a block from an earlier rank inverted (the inverted skip test)",
        Expect(
            kind="mismatch", world_size=2, mesh=(2,), check=lambda c: _variant(c) == "zigzag", note="zigzag"
        ),
        p95=4,
        link="zhuzilin/ring-flash-attention@4072701",
    ),
    PlantedBug(
        "stale_kv_backward",
        "backward ring recomputes every step with the K/V of step 0 while dK/dV still travel; "
        "the forward is right",
        Expect(
            kind="mismatch",
            world_size=2,
            mesh=(2,),
            check=lambda c: _variant(c) == "full",
            outputs=lambda outs: set(outs) <= set(GRADIENTS),
            note="non-causal (full), only gradients wrong",
        ),
        p95=2,
        link="huggingface/diffusers#14265",
    ),
    PlantedBug(
        "reversed_ring",
        "K/V sent to the previous rank, received from the next: a wrong peer, right at exactly 2 ranks",
        # at 3 ranks it needs the causal bookkeeping, or uneven blocks (read with the wrong source's
        # length) in the non-causal variant: either is minimal
        Expect(
            kind="mismatch",
            world_size=3,
            mesh=(3,),
            uneven=None,
            check=lambda c: (
                (_variant(c) == "causal" and not uneven_sizes(c))
                or (_variant(c) == "full" and uneven_sizes(c) == ("seq",))
            ),
            note="right at 2 ranks",
        ),
        p95=2,
    ),
    PlantedBug(
        "bf16_exp2",
        "bf16 fast kernel's block softmax computes exp as exp2 without the log2(e) factor (the "
        "backward keeps exp); fp32 and fp64 right",
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
]

#: PyTorch's context-parallel ring (targets/ring_attention_torch.py)
TORCH_RING = "shardfuzz.targets.ring_attention_torch:torch_cp_ring"
#: the regions of torch's two known failures (as --exclude expressions): each proof sets the other aside
RING_UNEVEN_SEQ = "sizes['seq'] % group_size != 0"
ZIGZAG_ONE_TOKEN_PER_RANK = (
    "options['variant'] == 'zigzag' and sizes['seq'] == group_size and group_size >= 2"
)

EXPECTED = [
    ExpectedFailure(
        "torch_cp_ring",
        "torch's context-parallel ring (_templated_ring_attention, CPU flash kernels) aborts the "
        "process on a sequence the group does not divide: the ranks' K/V buffers differ in size "
        "(gloo EnforceNotMet 'Received data size doesn't match expected size'); torch requires "
        "seq % cp == 0",
        Expect(
            kind="rank-error",
            world_size=2,
            mesh=(2,),
            uneven=("seq",),
            check=lambda c: c.sizes["seq"] == 3,
            note="seq 3",
            exclude=(ZIGZAG_ONE_TOKEN_PER_RANK,),  # torch_cp_ring_zigzag's IndexError
        ),
        p95=2,
        impl=bind(TORCH_RING),
    ),
    ExpectedFailure(
        "torch_cp_ring_zigzag",
        "torch's load-balanced ring (enable_load_balance: the zigzag layout) on one token per rank "
        "(seq == cp) raises an IndexError inside _templated_ring_attention rather than a clear "
        "error: it cuts each rank's block in two halves (longer blocks pass, odd ones too: seq 6 on "
        "2 ranks, 9 on 3)",
        Expect(
            kind="rank-error",
            world_size=2,
            mesh=(2,),
            uneven=None,
            check=lambda c: c.options["variant"] == "zigzag" and c.sizes["seq"] == 2,
            note="zigzag, seq 2",
            exclude=(RING_UNEVEN_SEQ,),  # torch_cp_ring's abort
        ),
        p95=3,
        impl=bind(TORCH_RING),
    ),
    ExpectedFailure(
        "torch_cp_ring_float64",
        "torch's context-parallel ring merges the blocks in float32 (_cp_options.convert_to_f32, on "
        "by default) also for float64 inputs, so its float64 LSE is only float32-accurate",
        Expect(
            kind="mismatch", world_size=1, mesh=(1,), check=lambda c: c.dtype == "float64", note="float64"
        ),
        p95=1,
        impl=bind(TORCH_RING, even_only=True, float64=True),
    ),
]

# torch's context-parallel ring on what it supports: tests/test_verified.py runs each one
VERIFIED = [
    Verified(
        name=f"torch_cp_ring_even{suffix}",
        what=f"torch's context-parallel ring ({rotate} rotation) on even sequences, without the LSE "
        "gradient it does not give (the option lse_grad pinned False)",
        examples=30,
        options={"lse_grad": False},
        reaches=("variant=full", "variant=causal", "variant=zigzag"),
        refuses=("uneven seq",),
    )
    for suffix, rotate in (("", "all-gather"), ("_a2a", "all-to-all"))
]

TARGET = Target(
    name="ring_attention",
    description="ring attention with LSE merge: non-causal, causal with block skipping, zigzag causal",
    cases=cases,
    inputs=inputs,
    oracle=oracle,
    outputs=outputs,
    implementations={
        "reference": "reference",
        **{
            f"torch_cp_ring_even{suffix}": bind(TORCH_RING, rotate=rotate, even_only=True)
            for suffix, rotate in (("", "allgather"), ("_a2a", "alltoall"))
        },
    },
    planted=PLANTED,
    expected_failures=EXPECTED,
    verified=VERIFIED,
    triggers=TRIGGERS,
    gradients=GRADIENTS,
    comm={"reference": reference_comm},
)
