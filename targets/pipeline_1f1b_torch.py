"""``torch.distributed.pipelining`` as an implementation of ``pipeline_1f1b``.

Each rank builds its stage's layers as an ``nn.Sequential`` of ``Linear`` + ``GELU`` (the case's
weights, in the case dtype), wraps it in a ``PipelineStage`` on the target's group, and steps
``ScheduleGPipe`` or ``Schedule1F1B`` (the case's ``kind``) over ``M`` micro-batches with
``F.mse_loss`` as the loss: torch splits the batch into the micro-batches, runs each loss
unscaled and divides the gradients by ``M`` (``scale_grads=True``), so the whole batch's mean loss
is the mean of the returned per-micro-batch losses. The recorded order is torch's own execution:
the stage's ``forward_one_chunk`` and ``backward_one_chunk`` are wrapped to log ``("F", mb)`` and
``("B", mb)`` as torch calls them, then judged by the target (order and unit-clock bubble). Each
stage's activations come from a forward hook on its module.

``Schedule1F1B`` refuses ``M < P`` (``ValueError``: pytorch/pytorch#144702 added the check after
a hang); those cases are ``Unsupported`` (counted, reason ``1F1B with M < P``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from shardfuzz import Unsupported
from shardfuzz.targets.pipeline_1f1b import judge_orders, stage_layers


def _module(w: torch.Tensor, b: torch.Tensor) -> nn.Module:
    layers: list[nn.Module] = []
    for wi, bi in zip(w, b):
        lin = nn.Linear(wi.shape[1], wi.shape[0], dtype=wi.dtype)
        with torch.no_grad():
            lin.weight.copy_(wi)
            lin.bias.copy_(bi)
        layers += [lin, nn.GELU()]
    return nn.Sequential(*layers)


def torch_pipeline(ctx):
    """This rank's stage under torch's ``ScheduleGPipe`` / ``Schedule1F1B``."""
    case, inp = ctx.case, ctx.inputs
    p, s, m = ctx.group_size, ctx.group_rank, case.options["microbatches"]
    kind = case.options["kind"]
    if kind == "1f1b" and m < p:
        raise Unsupported(f"Schedule1F1B needs M >= P (M={m}, P={p})", reason="1F1B with M < P")
    counts = stage_layers(case)
    first = sum(counts[:s])
    mod = _module(inp["w"][first : first + counts[s]], inp["b"][first : first + counts[s]])
    acts: list[torch.Tensor] = []
    mod.register_forward_hook(
        lambda _m, _a, out: acts.append(out.detach()) if out.device.type != "meta" else None
    )
    stage = PipelineStage(mod, s, p, ctx.device, group=ctx.group)
    order: list[tuple[str, int]] = []
    fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def forward_one_chunk(chunk, *args, **kwargs):
        order.append(("F", chunk))
        return fwd(chunk, *args, **kwargs)

    def backward_one_chunk(chunk, *args, **kwargs):
        order.append(("B", chunk))
        return bwd(chunk, *args, **kwargs)

    stage.forward_one_chunk = forward_one_chunk  # type: ignore[method-assign]
    stage.backward_one_chunk = backward_one_chunk  # type: ignore[method-assign]
    schedule = (ScheduleGPipe if kind == "gpipe" else Schedule1F1B)(
        stage, n_microbatches=m, loss_fn=F.mse_loss
    )
    losses: list[torch.Tensor] = []
    args = (inp["x"],) if s == 0 else ()
    if s == p - 1:
        schedule.step(*args, target=inp["t"], losses=losses)
    else:
        schedule.step(*args)
    lins = [mod[2 * j] for j in range(counts[s])]
    return {
        "acts": torch.cat(acts[-m:]).unsqueeze(0),
        "grad_w": torch.stack([lin.weight.grad for lin in lins]),
        "grad_b": torch.stack([lin.bias.grad for lin in lins]),
        "loss": torch.stack(losses).mean().detach() if s == p - 1 else torch.zeros(0, dtype=inp["x"].dtype),
        "bubble": judge_orders(ctx, order),
    }
