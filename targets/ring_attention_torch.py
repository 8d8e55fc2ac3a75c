"""PyTorch's own context-parallel ring as implementations of ``ring_attention``.

``torch.distributed.tensor.experimental._context_parallel``'s ``_templated_ring_attention`` and
its backward, on the CPU flash kernels (``aten._scaled_dot_product_flash_attention_for_cpu`` and
its backward): the ring that the public ``context_parallel`` runs, reached directly because no
DTensor sharding strategy is registered for the CPU kernel. The target's variants map onto torch's
options: ``full`` is ``is_causal=False``, ``causal`` is ``is_causal=True``, ``zigzag`` is
``is_causal=True`` with ``enable_load_balance`` (torch's round-robin: rank ``i`` holds chunks ``i``
and ``2 cp - 1 - i``, the ``Zigzag(1)`` layout). ``rotate`` picks the K/V rotation
(``allgather`` or ``alltoall``).

Contract: torch's ring takes no gradient into the LSE, so cases with ``lse_grad=True`` are
``Unsupported`` (counted); the LSE is still compared. ``torch_cp_ring*`` runs every sequence
length: on one the group does not divide, the ranks' K/V buffers differ in size and the rotation
fails (the expected failure ``torch_cp_ring`` of the target). ``torch_cp_ring_even*`` rejects those
cases as ``Unsupported`` (torch documents ``seq % cp == 0``), and is fuzzed as a correct
implementation.
"""

from __future__ import annotations

import torch

from shardfuzz import Unsupported
from shardfuzz.targets.ring_attention import LAYOUTS, layout_of

_ROTATIONS = ("allgather", "alltoall")


def _check(ctx, even_only: bool, float64: bool) -> None:
    case = ctx.case
    if case.options.get("lse_grad", True):
        raise Unsupported("torch's ring takes no gradient into the LSE (lse_grad=True)", reason="lse_grad")
    if case.dtype == "float64" and not float64:
        raise Unsupported(
            "torch's ring merges in float32 (_cp_options.convert_to_f32), also for float64 inputs",
            reason="float64",
        )
    n, sp = ctx.inputs["q"].shape[1], ctx.group_size
    chunks = 2 * sp if case.options["variant"] == "zigzag" else sp
    if even_only and n % chunks:
        raise Unsupported(
            f"torch's ring needs the sequence divisible by {'2 x ' if chunks > sp else ''}cp",
            reason="uneven seq",
        )


def torch_cp_ring(ctx, *, rotate: str = "allgather", even_only: bool = False, float64: bool = False):
    """torch's context-parallel ring forward and backward on this rank's shards."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp
    except ImportError as e:  # a torch without this private module: refused, counted
        raise Unsupported(f"this torch has no context-parallel ring: {e}", reason="no cp ring") from e

    if rotate not in _ROTATIONS:
        raise ValueError(f"rotate={rotate!r}; allowed: {', '.join(_ROTATIONS)}")
    _check(ctx, even_only, float64)
    variant = ctx.case.options["variant"]
    seq, _ = LAYOUTS[layout_of(ctx.case)]
    # torch's layout is [batch, heads, seq, head_dim]; the target's is [batch, seq, heads, head_dim]
    q, k, v, dout = (ctx.shard(ctx.inputs[name], seq).transpose(1, 2) for name in ("q", "k", "v", "dout"))
    scale = ctx.inputs["q"].shape[-1] ** -0.5
    causal = variant != "full"
    aten = torch.ops.aten
    options = cp._cp_options
    saved = (options.enable_load_balance, options.rotate_method)
    try:  # module-level options: set for this call only
        options.enable_load_balance = variant == "zigzag"
        options.rotate_method = (
            cp._RotateMethod.ALL_GATHER if rotate == "allgather" else cp._RotateMethod.ALL_TO_ALL
        )
        out, lse = cp._templated_ring_attention(
            ctx.group,
            2,
            aten._scaled_dot_product_flash_attention_for_cpu,
            q,
            k,
            v,
            is_causal=causal,
            scale=scale,
        )[:2]
        dq, dk, dv = cp._templated_ring_attention_backward(
            ctx.group,
            2,
            aten._scaled_dot_product_flash_attention_for_cpu_backward,
            dout.contiguous(),
            "grad_out",
            q,
            k,
            v,
            out,
            lse,
            is_causal=causal,
            dropout_p=0.0,
            scale=scale,
        )[:3]
    finally:
        options.enable_load_balance, options.rotate_method = saved
    back = lambda t: t.transpose(1, 2).contiguous()
    return {"out": back(out), "lse": lse, "grad_q": back(dq), "grad_k": back(dk), "grad_v": back(dv)}
