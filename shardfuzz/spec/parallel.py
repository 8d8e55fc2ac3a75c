"""Building blocks of sharded code that targets (built-in and yours) may import.

* :class:`CopyToGroup` and :class:`ReduceFromGroup`: Megatron's conjugate pair ``f``/``g``. ``f``
  is the identity forward and all-reduces the gradient backward; ``g`` all-reduces forward and is
  the identity backward. A column-parallel linear starts with ``f``, a row-parallel one ends with
  ``g``.
* :class:`GatherSequence` and :class:`ReduceScatterSequence`: Megatron's sequence-parallel pair
  on dim 1 (``[batch, seq, ...]``), uneven and empty shards by DTensor's rule included: all-gather
  forward / reduce-scatter backward, and reduce-scatter forward / all-gather backward, written with
  ``all_reduce`` alone (the gather as the sum of a zero-filled buffer: exact).
* :class:`AllToAll`: ``all_to_all_single`` along dim 0 with uneven splits, inside autograd (the
  backward is the reverse all-to-all), with an optional wire dtype for the gradient.
* :func:`all_reduce_by_all_to_all`, :func:`reduce_scatter_by_all_to_all`,
  :func:`all_gather_by_all_to_all`: the three collectives written with ``all_to_all_single``
  alone, for backends or devices that lack a native one (gloo on CUDA tensors), on equal chunks.

Every helper is right for inputs of any strides (transposed, sliced, expanded, offset), and for
ranks whose inputs are laid out differently: collectives reduce raw memory, so each helper sends a
row-major copy.

Collectives in autograd must sit inside an ``autograd.Function``: ``dist.all_reduce`` called
directly is treated as the identity by autograd (pytorch/pytorch#152127), which shardfuzz reports as
an ``ignored-collective`` finding.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from shardfuzz.spec.layouts import split_offsets, split_sizes


class CopyToGroup(torch.autograd.Function):
    """``f``: identity forward, all-reduce of the gradient backward (``reduce_backward=False``
    skips it, for planted bugs)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, reduce_backward: bool = True) -> torch.Tensor:
        ctx.group, ctx.reduce_backward = group, reduce_backward
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        grad = dense_copy(grad)
        if ctx.reduce_backward:
            dist.all_reduce(grad, group=ctx.group)
        return grad, None, None


class ReduceFromGroup(torch.autograd.Function):
    """``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:  # noqa: ARG004 (autograd passes ctx)
        out = dense_copy(x)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:  # noqa: ARG004 (autograd passes ctx)
        return grad, None


def dense_copy(t: torch.Tensor) -> torch.Tensor:
    """A row-major copy of ``t``: collectives work on raw memory, so a buffer must be laid out the
    same on every rank (``clone()`` keeps a transposed, sliced or expanded input's own strides)."""
    return t.clone(memory_format=torch.contiguous_format)


def gather_seq(t: torch.Tensor, group: Any, seq_len: int, dim: int = 1) -> torch.Tensor:
    """All-gather of ``dim`` shards (DTensor's rule; dim 1, the sequence, by default), as an
    all-reduce of a zero-filled full buffer: uneven and empty shards need no padding, and it runs
    wherever all_reduce does (gloo on CUDA)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    full = t.new_zeros(*t.shape[:dim], seq_len, *t.shape[dim + 1 :])
    off = split_offsets(seq_len, size)[rank]
    full.narrow(dim, off, t.shape[dim]).copy_(t)
    dist.all_reduce(full, group=group)
    return full


def reduce_scatter_seq(t: torch.Tensor, group: Any, reduce: bool = True, dim: int = 1) -> torch.Tensor:
    """This rank's ``dim`` shard of the sum over the group (``reduce=False``: of its own ``t``)."""
    full = dense_copy(t)
    if reduce:
        dist.all_reduce(full, group=group)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    off, n = split_offsets(t.shape[dim], size)[rank], split_sizes(t.shape[dim], size)[rank]
    return full.narrow(dim, off, n).clone()


class GatherSequence(torch.autograd.Function):
    """All-gather of the sequence (``dim``, 1 by default) forward, reduce-scatter of the gradient
    backward (``reduce_backward=False`` only slices it, for planted bugs)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, group: Any, seq_len: int, reduce_backward: bool = True, dim: int = 1
    ) -> torch.Tensor:
        ctx.group, ctx.reduce_backward, ctx.dim = group, reduce_backward, dim
        return gather_seq(x, group, seq_len, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return reduce_scatter_seq(grad, ctx.group, ctx.reduce_backward, ctx.dim), None, None, None, None


class ReduceScatterSequence(torch.autograd.Function):
    """Reduce-scatter of the sequence (``dim``, 1 by default) forward (``reduce=False`` only slices,
    for planted bugs), all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, reduce: bool = True, dim: int = 1) -> torch.Tensor:
        ctx.group, ctx.seq_len, ctx.dim = group, x.shape[dim], dim
        return reduce_scatter_seq(x, group, reduce, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        return gather_seq(grad, ctx.group, ctx.seq_len, ctx.dim), None, None, None


def gather_shards(x: torch.Tensor, group: Any, size: int, dim: int = 1) -> torch.Tensor:
    """The whole tensor from each rank's ``dim`` shard (``size`` long in all, split by DTensor's
    rule, uneven and empty shards included), inside autograd: all-gather forward, reduce-scatter of
    the gradient backward (Megatron's sequence-parallel gather)."""
    return GatherSequence.apply(x, group, size, True, dim)


def reduce_scatter_shards(x: torch.Tensor, group: Any, dim: int = 1) -> torch.Tensor:
    """This rank's ``dim`` shard (DTensor's rule) of the sum of ``x`` over the group, inside
    autograd: reduce-scatter forward, all-gather of the gradient backward (Megatron's
    sequence-parallel reduce-scatter; a TorchRec-style combine over the batch with ``dim=0``)."""
    return ReduceScatterSequence.apply(x, group, True, dim)


class AllToAll(torch.autograd.Function):
    """``AllToAll.apply(x, out_splits, in_splits, group, grad_dtype=None)``: rows of ``x`` (dim 0)
    are sent in chunks of ``in_splits`` rows to each rank, and ``out_splits`` rows are received from
    each; the backward is the reverse all-to-all. ``grad_dtype`` sends the gradient in another dtype
    (a bandwidth saving that loses precision; the planted ``bf16_grad_a2a`` bug)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        group: Any,
        grad_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        ctx.splits, ctx.group, ctx.grad_dtype = (out_splits, in_splits), group, grad_dtype
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        out_splits, in_splits = ctx.splits
        dtype = grad.dtype
        if ctx.grad_dtype is not None:
            grad = grad.to(ctx.grad_dtype)
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back.to(dtype), None, None, None, None


def all_reduce_by_all_to_all(t: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """The sum of ``t`` over the group (every rank sends its copy to every rank)."""
    out = torch.empty(size * t.numel(), dtype=t.dtype, device=t.device)
    dist.all_to_all_single(out, t.reshape(-1).repeat(size), group=group)
    return out.view(size, *t.shape).sum(0)


def reduce_scatter_by_all_to_all(buf: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """Rank ``i`` gets the sum over ranks of chunk ``i`` of ``buf`` (``size`` equal chunks)."""
    buf = buf.reshape(-1).contiguous()  # chunks of the values, whatever buf's strides
    out = torch.empty_like(buf)
    dist.all_to_all_single(out, buf, group=group)
    return out.view(size, -1).sum(0)


def all_gather_by_all_to_all(shard: torch.Tensor, group: Any, size: int) -> torch.Tensor:
    """Every rank's ``shard``, concatenated in rank order."""
    out = torch.empty(size * shard.numel(), dtype=shard.dtype, device=shard.device)
    dist.all_to_all_single(out, shard.reshape(-1).repeat(size), group=group)
    return out
