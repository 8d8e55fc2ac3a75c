"""Self-oracle targets for the tests: ``examples/row_parallel_self.py`` with two more planted
bugs, the same with a written oracle, and the built-in ``tp_mlp`` with its oracle replaced by
``"self"``.

* ``w_offset_zero``: every rank slices its columns of ``w`` at rank 0's offset (right at world
  size 1): a self-oracle finds it.
* ``bias_twice``: the bias is added twice, at every world size: a self-oracle cannot see it, by
  design; the written oracle does.
"""

import dataclasses
from pathlib import Path

import torch

from shardfuzz import Expect, PlantedBug, TargetError
from shardfuzz.spec.refs import import_file
from shardfuzz.spec.registry import get_target
from shardfuzz.targets import tp_mlp

_EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "row_parallel_self.py")
EXAMPLE = get_target(_EXAMPLE)
_row_parallel = import_file(_EXAMPLE, "example").row_parallel


def written_oracle(inp, case):  # what the example leaves out: the unsharded layer, by hand
    x, w, b = (inp[k].clone().requires_grad_() for k in ("x", "w", "b"))
    y = x @ w.T + b
    y.backward(inp["dy"])
    return {"y": y.detach(), "grad_x": x.grad, "grad_w": w.grad, "grad_b": b.grad}


def w_offset_zero(ctx):  # planted: rank r > 0 multiplies its x by rank 0's columns of w
    local = ctx.inputs["w"][:, : ctx.local["w"].shape[1]]
    return _row_parallel(dataclasses.replace(ctx, local={**ctx.local, "w": local}))


def bias_twice(ctx):  # planted: y + 2 b at every world size
    out = _row_parallel(ctx)
    return {**out, "y": out["y"] + ctx.inputs["b"]}


def needs_two_ranks(ctx):  # a reference that cannot run alone: no self-oracle for it
    if ctx.group_size == 1:
        raise RuntimeError("this layer needs at least two ranks")
    return _row_parallel(ctx)


def softmax_live_max(ctx):  # softmax of y written by hand, its max not detached: the noise model refuses it
    out = _row_parallel(ctx)
    y = out["y"].clone().requires_grad_()
    e = torch.exp(y - y.amax(-1, keepdim=True))
    return {**out, "y": (e / e.sum(-1, keepdim=True)).detach()}


def target_error_under_a_mode(ctx):  # raises shardfuzz's TargetError only where a dispatch mode runs
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    if _get_current_dispatch_mode() is not None:
        raise TargetError("target='no_such_target' is unknown")  # as a helper the user calls would
    return _row_parallel(ctx)


BUGS = {"w_offset_zero": "w_offset_zero", "bias_twice": "bias_twice"}
SELF = EXAMPLE.derive(
    "row_parallel_self_bugs",
    implementations={
        **BUGS,
        "needs_two_ranks": "needs_two_ranks",
        "softmax_live_max": "softmax_live_max",
        "target_error_under_a_mode": "target_error_under_a_mode",
    },
)
WRITTEN = EXAMPLE.derive("row_parallel_written", implementations=BUGS, oracle=written_oracle)

TP_SELF = tp_mlp.TARGET.derive(
    "tp_mlp_self",
    oracle="self",
    description="tp_mlp, its own oracle at world size 1 in float64",
    planted=[
        PlantedBug(
            "bias_before_allreduce",
            "row-parallel bias added on every rank before the all-reduce",
            Expect(kind="mismatch", world_size=2, mesh=(2,), outputs=("y",)),
            p95=1,
        )
    ],
)
