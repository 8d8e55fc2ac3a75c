"""A user's own implementation of examples/row_parallel_cancel.py that hands a non-contiguous
tensor to ``dist.all_reduce`` (tests/test_memory_layouts.py), as a Megatron-style TP attention did: its
einsum laid the partial sum out differently on a rank holding 2 heads than on one holding 1."""

import torch.distributed as dist


def transposed_partial(ctx):
    """The partial sum as ``(w^T x^T)^T`` where this rank holds more than one inner column: the
    same values, laid out column-major; gloo reduces its memory as if it were row-major."""
    x, w = ctx.local["x"], ctx.local["w"]
    y = (w.t() @ x.t()).t() if x.shape[1] > 1 else x @ w
    dist.all_reduce(y, group=ctx.group)
    return {"y": y}
