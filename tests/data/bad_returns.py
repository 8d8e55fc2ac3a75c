"""Implementations of the built-in tp_mlp that return something other than a tensor for an output."""

from shardfuzz.targets import tp_mlp


def ret_none_grad(ctx):
    """An unused gradient comes back as None (here grad_b2): a layout finding, the oracle has a value."""
    out = tp_mlp.reference(ctx)
    out["grad_b2"] = None
    return out


def ret_tuple(ctx):
    """The outputs as a tuple, not a dict: the implementation's contract, not its math."""
    return tuple(tp_mlp.reference(ctx).values())


def gather_into_new_buffer(ctx):
    """The row-parallel sum by a raw all-gather into new buffers: the forward is right, but the
    collective has no backward, so autograd stops there and every gradient behind it is None."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    x, w1, b1, w2 = (
        t.clone().requires_grad_() for t in (ctx.inputs["x"], *(ctx.local[k] for k in ("w1", "b1", "w2")))
    )
    b2 = ctx.inputs["b2"].clone().requires_grad_()
    partial = F.linear(F.gelu(F.linear(x, w1, b1)), w2).contiguous()
    parts = [torch.empty_like(partial) for _ in range(ctx.group_size)]
    dist.all_gather(parts, partial, group=ctx.group)
    y = torch.stack(parts).sum(0) + b2
    y.backward(ctx.inputs["dy"])
    grads = {f"grad_{k}": t.grad for k, t in (("x", x), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))}
    return {"y": y.detach(), **grads}
