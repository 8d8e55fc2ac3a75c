"""PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) as implementations of ``zero_adamw_torch``.

The target's three parameters (sizes ``p0``-``p2``, drawn relative to the group, so shards are
uneven and some ranks hold empty ones) are registered on one module and ``fully_shard``-ed: FSDP2
shards each parameter ``Shard(0)`` on its own, by DTensor's rule (5 elements on 4 ranks:
``[2, 2, 1, 0]``), and all-gathers / reduce-scatters the three together. Then, per step:

* each micro-batch computes this rank's loss ``0.5 * sum(a * (p - x) ** 2) / grad_accum`` (its
  local mean over micro-batches; FSDP2 averages over the data-parallel ranks, as DDP does), with
  gradient synchronisation off (``set_requires_gradient_sync(False)``, FSDP2's ``no_sync``) on
  all but the last micro-batch: the unsharded gradients accumulate locally and are
  reduce-scattered once;
* ``torch.nn.utils.clip_grad_norm_`` on the sharded DTensor gradients when the case clips
  (``max_norm`` from ``clip_factor``: the global norm is DTensor's);
* ``torch.optim.AdamW`` (the target's lr, betas, eps, weight decay) steps the DTensor parameters.

The state is returned as DTensors, so its layout is read, not declared: ``param_i``,
``exp_avg_i`` and ``exp_avg_sq_i`` are the per-step values stacked by DTensor (``[steps, p_i]``,
``Shard(1)``: each row FSDP2's ``Shard(0)``). The step counter is a plain tensor on every rank in
FSDP2 (not sharded), returned as a ``Replicate()`` DTensor so every rank's count is compared.

``fsdp2_hsdp`` is HSDP: ``fully_shard(mesh=2-D DeviceMesh)`` replicates over the outer axis and
shards over the inner one (placements ``(Replicate(), Shard(0))``): gradients are reduce-scattered
within a shard group and all-reduced across the replicas. It runs on a group of 4 as 2 x 2, every
rank with its own data (4-way data parallel); other group sizes are ``Unsupported`` (counted).

FSDP2 crashes on a parameter with no elements (``_chunk_cat expects non-empty tensor`` in its
reduce-scatter copy-in): ``fsdp2`` and ``fsdp2_hsdp`` reject such cases as ``Unsupported``;
``fsdp2_empty_param``, without that guard, is the expected failure of the target that shows it.
A torch without FSDP2's API raises ``Unsupported`` too.
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist

from shardfuzz import Unsupported
from shardfuzz.targets.zero_adamw import BETA1, BETA2, EPS, LR, WEIGHT_DECAY, param_sizes

#: the HSDP mesh of a group of 4: (replicate, shard)
HSDP_SHAPE = (2, 2)


class Params(torch.nn.Module):
    """The target's parameters on one module, so that ``fully_shard`` shards each of them."""

    def __init__(self, p0: torch.Tensor, sizes: list[int]) -> None:
        super().__init__()
        self.names = [f"p{i}" for i in range(len(sizes))]
        for name, t in zip(self.names, p0.split(sizes)):
            self.register_parameter(name, torch.nn.Parameter(t.clone()))

    def forward(self, a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        p = torch.cat([getattr(self, n) for n in self.names])  # unsharded inside FSDP2's forward
        return (0.5 * a * (p - x) ** 2).sum()


def _fully_shard():
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard
    except ImportError as e:  # torch < 2.6 keeps it in torch.distributed._composable.fsdp
        raise Unsupported(
            f"this torch has no torch.distributed.fsdp.fully_shard: {e}", reason="no FSDP2"
        ) from e
    if not hasattr(FSDPModule, "set_requires_gradient_sync"):
        raise Unsupported("this torch's FSDP2 has no set_requires_gradient_sync", reason="no FSDP2")
    return fully_shard


#: the HSDP mesh of each case group: id(group) -> (a weak reference to the group, the DeviceMesh)
_HSDP_MESHES: dict = {}


def _hsdp_mesh(ctx):
    """A 2 x 2 DeviceMesh (replicate, shard) over the group's 4 ranks, made on the first example
    and kept while the group lives (made per example and destroyed after it, the next example's
    ``clip_grad_norm_`` failed: "Could not resolve the process group registered under the name").
    One per case group object: the engine makes a case's groups per timeout, and a mesh kept per
    ranks was made again at every change of timeout (two more groups each time)."""
    from torch.distributed.device_mesh import DeviceMesh

    key = id(ctx.group)
    group, mesh = _HSDP_MESHES.get(key, (lambda: None, None))
    if group() is ctx.group:
        return mesh
    ranks = torch.tensor(ctx.mesh.ranks[-1]).view(HSDP_SHAPE)
    mine = [members for members in (*ranks.t().tolist(), *ranks.tolist()) if ctx.rank in members]
    # each rank makes its replicate group, then its shard group (only members take part)
    groups = [dist.new_group(members, use_local_synchronization=True) for members in mine]
    mesh = DeviceMesh.from_group(groups, ctx.device.type, mesh=ranks, mesh_dim_names=("replicate", "shard"))
    for gone in [k for k, (g, _) in _HSDP_MESHES.items() if g() is None]:  # case groups since freed
        del _HSDP_MESHES[gone]  # (a regroup): their meshes would hold old groups for ever
    _HSDP_MESHES[key] = (weakref.ref(ctx.group), mesh)
    return mesh


def _check(ctx, hsdp: bool) -> None:
    if hsdp and ctx.group_size != 4:
        raise Unsupported(
            f"HSDP here is 2 x 2 (replicate over 2, shard over 2): needs a group of 4, got {ctx.group_size}",
            reason="HSDP needs a group of 4",
        )


def fsdp2(ctx, *, hsdp: bool = False, empty_params: bool = False):
    """FSDP2 ``fully_shard`` + ``torch.optim.AdamW``, clipping and no-sync gradient accumulation."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate

    fully_shard = _fully_shard()
    _check(ctx, hsdp)
    # the HSDP mesh first: the example that makes its groups (a rank's first of this implementation
    # and mesh, the only one allowed to leave groups behind) must not be a refused one
    if hsdp:
        mesh = _hsdp_mesh(ctx)
    else:
        mesh = DeviceMesh.from_group(ctx.group, ctx.device.type, mesh=torch.tensor(ctx.mesh.ranks[-1]))
    if not empty_params and 0 in param_sizes(ctx.case):
        # known discrepancy, the expected failure fsdp2_empty_param: rejected loudly, never passed
        raise Unsupported(
            "FSDP2's reduce-scatter crashes on a parameter with no elements", reason="empty parameter"
        )
    opts = ctx.case.options
    steps, accum = opts["steps"], opts["grad_accum"]
    p0, max_norm = ctx.inputs["p0"], ctx.inputs["max_norm"]
    a, x = ctx.inputs["a"][:, :, ctx.group_rank], ctx.inputs["x"][:, :, ctx.group_rank]
    model = Params(p0, param_sizes(ctx.case))
    fully_shard(model, mesh=mesh)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=LR, betas=(BETA1, BETA2), eps=EPS, weight_decay=WEIGHT_DECAY)
    rows = {k: [[] for _ in params] for k in ("param", "exp_avg", "exp_avg_sq", "step")}
    for t in range(steps):
        for mb in range(accum):
            model.set_requires_gradient_sync(mb == accum - 1)  # no_sync on all but the last
            (model(a[t, mb], x[t, mb]) / accum).backward()
        if max_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_norm)
        opt.step()
        opt.zero_grad()
        for i, q in enumerate(params):
            state = opt.state[q]
            rows["param"][i].append(q.detach().clone())
            rows["exp_avg"][i].append(state["exp_avg"].clone())
            rows["exp_avg_sq"][i].append(state["exp_avg_sq"].clone())
            rows["step"][i].append(state["step"].reshape(1).float())
    out, replicate = {}, [Replicate()] * mesh.ndim
    for i in range(len(params)):
        for k in ("param", "exp_avg", "exp_avg_sq"):
            out[f"{k}_{i}"] = torch.stack(rows[k][i])  # DTensor: Shard(0) rows stacked -> Shard(1)
        # FSDP2 keeps a plain step counter on every rank: each rank's is compared
        out[f"step_{i}"] = DTensor.from_local(torch.cat(rows["step"][i]), mesh, replicate, run_check=False)
    return out
