"""Reproducer: tp_mlp / torch_tp (rank-error).

2 rank(s), mesh (2,); sizes batch=1, seq=1, d_model=1, hidden=3, d_out=1; float32; options {}.
Run: torchrun --nproc-per-node=2 repro_tp_mlp_torch_tp.py    (add --backend nccl for GPUs)
Needs only torch (written with torch 2.13.0+cpu by shardfuzz 0.1.0 on 2026-12-07). Each rank runs the
implementation below on its inputs and compares its outputs with the oracle's float64 values,
within the tolerance shardfuzz allows a mismatch after its recheck (a report of a mismatch far
past it shows the narrower bound before the recheck, which it skips there); every wrong output of
a rank, or an error, fails the run. A rank stuck in a collective (a hang) fails after
COLLECTIVE_TIMEOUT_S seconds instead of waiting forever.
"""

from typing import Any
import dataclasses
import datetime
import functools
import os
import random
import sys
import torch
import torch.distributed as dist
import torch.nn.functional as F


class Unsupported(Exception):
    """The implementation refuses this case (shardfuzz counts it; here it is an error)."""

    def __init__(self, message, reason=None):
        super().__init__(message)


# -- the implementation under test --------------------------------------------------------------
EPS = 1e-5


class _MLP(torch.nn.Module):
    def __init__(self, inp, sp):
        super().__init__()
        w1, w2 = inp["w1"], inp["w2"]
        # sequence parallelism puts the target's LayerNorm first (torch's SequenceParallel shards it)
        self.norm = torch.nn.LayerNorm(w1.shape[1], eps=EPS, dtype=w1.dtype) if sp else torch.nn.Identity()
        self.fc1 = torch.nn.Linear(w1.shape[1], w1.shape[0], dtype=w1.dtype)
        self.fc2 = torch.nn.Linear(w2.shape[1], w2.shape[0], dtype=w2.dtype)
        params = {"fc1.weight": "w1", "fc1.bias": "b1", "fc2.weight": "w2", "fc2.bias": "b2"}
        if sp:
            params.update({"norm.weight": "ln_weight", "norm.bias": "ln_bias"})
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(inp[params[name]])

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


def sequence_parallel(case) -> bool:
    return bool(case.options.get("sequence_parallel", False))


TORCH_TP_SIZE1_REFUSAL = "torch TP: Linear on a DTensor whose sharded dim has global size 1"


def _plan(sp: bool, local_output: bool) -> dict:
    """torch TP's plan: Colwise fc1, Rowwise fc2; with ``sp``, SequenceParallel on the norm and the
    activations ``Shard(1)`` into fc1 and out of fc2. ``local_output=False`` keeps DTensors between
    the modules (the input of fc2 is then the DTensor fc1 returns) and, with ``sp``, out of the
    module."""
    from torch.distributed.tensor import Shard as DShard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    seq = {"input_layouts": DShard(1)} if sp else {}
    plan = {
        "fc1": ColwiseParallel(**seq, use_local_output=local_output),
        "fc2": RowwiseParallel(
            **({} if local_output else {"input_layouts": DShard(-1)}),
            **({"output_layouts": DShard(1)} if sp else {}),
            # the plain DTensor plan returns y as a local (replicated) tensor, as it always did
            use_local_output=local_output or not sp,
        ),
    }
    if sp:
        plan["norm"] = SequenceParallel(use_local_output=local_output)
    return plan


class ShardfuzzError(Exception):
    """Base class for errors of the fuzzer itself (not findings)."""


class InvalidArgument(ShardfuzzError, ValueError):
    """An argument is invalid. The message names the argument, its value and what is allowed."""


SPLIT_RULES = ("dtensor", "tensor_split")


def split_sizes(size: int, parts: int, rule: str = "dtensor") -> list[int]:
    """Sizes of the ``parts`` shards of a dim of length ``size`` under ``rule``."""
    if parts < 1:
        raise InvalidArgument(f"parts={parts!r}; must be >= 1")
    if size < 0:
        raise InvalidArgument(f"size={size!r}; must be >= 0")
    if rule == "dtensor":
        chunk = -(-size // parts)
        return [max(0, min(chunk, size - i * chunk)) for i in range(parts)]
    if rule == "tensor_split":
        base, rem = divmod(size, parts)
        return [base + (1 if i < rem else 0) for i in range(parts)]
    raise InvalidArgument(f"rule={rule!r}; allowed: {', '.join(map(repr, SPLIT_RULES))}")


class Layout:
    """Base class. Subclasses are frozen dataclasses, so they pickle and print cleanly."""

    #: whether each rank's local can be compared on its own (False for Partial)
    per_rank: bool = True

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        raise NotImplementedError

    def expected_shape(
        self, held: tuple[int, ...], global_shape: tuple[int, ...], rank: int, parts: int
    ) -> tuple[int, ...]:
        """The shape ``rank`` must hold, given the shape ``held`` it holds (for layouts with a choice)."""
        return self.local_shape(global_shape, rank, parts)

    def holds_piece(self, held: tuple[int, ...], global_shape: tuple[int, ...]) -> bool:
        """Whether a local of shape ``held`` holds something to compare."""
        return True

    def check_group(self, shapes: list[tuple[int, ...]], global_shape: tuple[int, ...]) -> str | None:
        """A problem with one group's local shapes taken together, or None."""
        return None

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        """The part of the global ``value`` (a tensor) that ``rank`` must hold."""
        raise NotImplementedError

    def comparable(self, local: Any, rank: int, parts: int, global_shape: tuple[int, ...]) -> Any:
        """The part of a rank's local that is compared (all of it, except padding)."""
        return local

    def assemble(self, locals_: list[Any]) -> Any:
        """Rebuild the global value from every rank's local, in group-rank order."""
        raise NotImplementedError

    def index_of(self, rank: int, group_size: int) -> int:
        """The index a world rank has in this layout's methods: its group rank."""
        return rank % group_size

    def replicas(self, case: Any) -> list[list[int]]:
        """The world ranks whose locals together make one global value, per replica."""
        return case.replica_ranks

    def assemble_at(self, ranks: list[int], locals_: list[Any]) -> Any:
        """:meth:`assemble` the locals of world ``ranks`` (one replica)."""
        return self.assemble(locals_)

    def global_index(
        self, local_index: tuple[int, ...], rank: int, parts: int, global_shape: tuple[int, ...]
    ) -> tuple[int, ...]:
        """Map an index into a rank's (comparable) local to an index into the global value."""
        return local_index


def _norm_dim(dim: int, ndim: int, layout: Layout) -> int:
    if not -ndim <= dim < max(ndim, 1):
        raise InvalidArgument(f"{layout!r}: dim={dim!r} is out of range for a {ndim}-d value")
    return dim % ndim


def split_offsets(size: int, parts: int, rule: str = "dtensor") -> list[int]:
    """Start offset of each shard."""
    sizes = split_sizes(size, parts, rule)
    return [sum(sizes[:i]) for i in range(parts)]


@functools.lru_cache(maxsize=4096)
def _split(size: int, parts: int, rule: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The sizes and offsets of a split, once per (size, parts, rule): the judge cuts every rank's
    piece of every output, tens of times an example."""
    return tuple(split_sizes(size, parts, rule)), tuple(split_offsets(size, parts, rule))


@dataclasses.dataclass(frozen=True)
class Shard(Layout):
    """Rank ``i`` holds the ``i``-th shard of ``dim`` under ``rule`` (``"dtensor"`` or ``"tensor_split"``).

    ``blocks=k``: ``dim`` is ``k`` equal blocks fused into one tensor (a fused ``[q; k; v]`` or
    ``[gate; up]`` projection weight), each block split over the ranks, and rank ``i`` holds its shard
    of every block, in block order (Megatron's fused QKV, vLLM's ``MergedColumnParallelLinear``). A
    plain ``Shard(0)`` of a fused ``[gate; up]`` weight gives rank 0 gate rows only: the classic bug."""

    dim: int
    rule: str = "dtensor"
    blocks: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.dim, int):
            raise InvalidArgument(f"Shard(dim={self.dim!r}); dim must be an int")
        if self.rule not in SPLIT_RULES:
            raise InvalidArgument(f"Shard(rule={self.rule!r}); allowed: {', '.join(map(repr, SPLIT_RULES))}")
        if not isinstance(self.blocks, int) or isinstance(self.blocks, bool) or self.blocks < 1:
            raise InvalidArgument(f"Shard(blocks={self.blocks!r}); blocks must be an int >= 1 (1: not fused)")

    def __repr__(self) -> str:
        args = [str(self.dim)]
        if self.rule != "dtensor":
            args.append(f"rule={self.rule!r}")
        if self.blocks != 1:
            args.append(f"blocks={self.blocks}")
        return f"Shard({', '.join(args)})"

    def _block(self, size: int) -> int:
        """The size of one fused block of a dim of ``size``."""
        if size % self.blocks:
            raise InvalidArgument(
                f"{self!r}: dim {self.dim} has size {size}, not a multiple of blocks={self.blocks} "
                "(the fused blocks must be equal)"
            )
        return size // self.blocks

    def local_shape(self, global_shape: tuple[int, ...], rank: int, parts: int) -> tuple[int, ...]:
        d = _norm_dim(self.dim, len(global_shape), self)
        shape = list(global_shape)
        shape[d] = self.blocks * split_sizes(self._block(global_shape[d]), parts, self.rule)[rank]
        return tuple(shape)

    def piece(self, value: Any, rank: int, parts: int) -> Any:
        import torch

        d = _norm_dim(self.dim, value.ndim, self)
        m = self._block(value.shape[d])
        sizes, offsets = _split(m, parts, self.rule)
        pieces = [value.narrow(d, b * m + offsets[rank], sizes[rank]) for b in range(self.blocks)]
        return pieces[0] if self.blocks == 1 else torch.cat(pieces, dim=d)

    def assemble(self, locals_: list[Any]) -> Any:
        import torch

        d = _norm_dim(self.dim, locals_[0].ndim, self)
        if self.blocks == 1:
            return torch.cat(list(locals_), dim=d)
        # each local is its shard of every block, in block order: block b of rank r is its b-th chunk
        chunked = [t.chunk(self.blocks, dim=d) if t.shape[d] else [t] * self.blocks for t in locals_]
        return torch.cat([c[b] for b in range(self.blocks) for c in chunked], dim=d)

    def global_index(
        self, local_index: tuple[int, ...], rank: int, parts: int, global_shape: tuple[int, ...]
    ) -> tuple[int, ...]:
        d = _norm_dim(self.dim, len(global_shape), self)
        m = self._block(global_shape[d])
        idx = list(local_index)
        size = split_sizes(m, parts, self.rule)[rank]
        block, within = divmod(idx[d], size) if self.blocks > 1 and size else (0, idx[d])
        idx[d] = block * m + split_offsets(m, parts, self.rule)[rank] + within
        return tuple(idx)


SEQ = Shard(1)


_PARAMS = {
    "w1": "fc1.weight",
    "b1": "fc1.bias",
    "w2": "fc2.weight",
    "b2": "fc2.bias",
    "ln_weight": "norm.weight",
    "ln_bias": "norm.bias",
}


def _torch_tp(
    ctx,
    *,
    local_output=True,
    guard_size1=True,
    sp_only=False,
    even_hidden=False,
    even_seq=False,
    nonempty_seq=False,
):
    """torch TP on this case. The guards refuse (``Unsupported``, counted) what a variant is
    restricted from: ``sp_only`` the plain MLP, ``even_hidden``/``even_seq`` sizes the group does
    not divide, ``nonempty_seq`` a rank without tokens; the size-1 guard a known discrepancy
    (``TORCH_TP_SIZE1``)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard as DShard
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module


    inp, sp, tp = ctx.inputs, sequence_parallel(ctx.case), ctx.group_size
    if sp_only and not sp:
        raise Unsupported(
            "a sequence-parallel plan: this case is the plain MLP", reason="not sequence parallel"
        )
    if even_hidden and inp["w1"].shape[0] % tp:
        raise Unsupported(
            "torch TP's local-tensor plan: hidden % tp != 0 (pytorch/pytorch#150336)", reason="uneven hidden"
        )
    if even_seq and sp and inp["x"].shape[1] % tp:
        raise Unsupported(
            "torch SP's local-tensor plan: seq % tp != 0 (pytorch/torchtitan#1306)", reason="uneven seq"
        )
    if nonempty_seq and sp and 0 in split_sizes(inp["x"].shape[1], tp):
        raise Unsupported(
            "a rank with no tokens (the local-tensor plan hangs there)", reason="empty seq shard"
        )
    if guard_size1 and inp["w1"].shape[0] == 1:
        # known discrepancy, see TORCH_TP_SIZE1 below: rejected loudly (counted), never passed
        raise Unsupported(TORCH_TP_SIZE1_REFUSAL)
    mesh = DeviceMesh.from_group(ctx.group, ctx.device.type, mesh=torch.tensor(ctx.mesh.ranks[-1]))
    mlp = _MLP(inp, sp)
    parallelize_module(mlp, mesh, _plan(sp, local_output))
    if not sp:
        x, dy = inp["x"].clone().requires_grad_(), inp["dy"]
    elif local_output:  # plain local tokens in and out: what the local-tensor plan is given
        x, dy = ctx.shard(inp["x"], SEQ).clone().requires_grad_(), ctx.shard(inp["dy"], SEQ)
    else:  # DTensors in and out, built from the full tensors without a collective
        x, dy = (distribute_tensor(inp[k], mesh, [DShard(1)], src_data_rank=None) for k in ("x", "dy"))
        x = x.detach().requires_grad_()
    y = mlp(x)
    y.backward(dy)
    y = y.detach()
    if local_output:  # the local plan's output may be an AsyncCollectiveTensor: wait for it
        y = y.clone() if y.__class__ is torch.Tensor else y.wait().clone()
    # the gradients (and the DTensor plan's y) are DTensors: the engine reads their placements
    out = {"y": y, "grad_x": x.grad}
    out.update({f"grad_{k}": mlp.get_parameter(m).grad for k, m in _PARAMS.items() if sp or "ln" not in k})
    return out


def torch_tp(ctx, **restrict):
    """The default ColwiseParallel / RowwiseParallel plan (sequence parallel: with SequenceParallel),
    plain tensors in and out; ``restrict``: the guards of :func:`_torch_tp`."""
    return _torch_tp(ctx, **restrict)


# -- the case, its inputs, the oracle's values and the allowed error ----------------------------
CASE = {'world_size': 2,
 'mesh': (2,),
 'sizes': {'batch': 1, 'seq': 1, 'd_model': 1, 'hidden': 3, 'd_out': 1},
 'dtype': 'float32',
 'options': {},
 'seed': 0}
DATA = {}
INPUTS = {
    'x': torch.tensor([[[1.5409960746765137]]], dtype=torch.float32),
    'w1': torch.tensor([[-0.293428897857666], [-2.1787893772125244], [0.5684312582015991]], dtype=torch.float32),
    'b1': torch.tensor([-1.0845223665237427, -1.3985954523086548, 0.40334683656692505], dtype=torch.float32),
    'w2': torch.tensor([[0.48383471369743347, -0.4152635633945465, -0.23287048935890198]], dtype=torch.float32),
    'b2': torch.tensor([-0.5966353416442871], dtype=torch.float32),
    'dy': torch.tensor([[[0.18203648924827576]]], dtype=torch.float32),
}
EXPECTED = {
    'y': torch.tensor([[[-0.9108690575914347]]], dtype=torch.float64),
    'grad_x': torch.tensor([[[-0.023848562011037727]]], dtype=torch.float64),
    'grad_w1': torch.tensor([[-0.017109277278715022], [2.5919049070456236e-06], [-0.07347458290380028]], dtype=torch.float64),
    'grad_b1': torch.tensor([-0.011102739039946359, 1.6819672351142861e-06, -0.04767992865862691], dtype=torch.float64),
    'grad_w2': torch.tensor([[-0.017395012951847928, -8.543878038698223e-07, 0.20949861991346047]], dtype=torch.float64),
    'grad_b2': torch.tensor([0.18203648924827576], dtype=torch.float64),
}
ALLOWED = {
    'y': torch.tensor([[[1.3738805364482687e-06]]], dtype=torch.float32),
    'grad_x': torch.tensor([[[7.048947026078167e-08]]], dtype=torch.float32),
    'grad_w1': torch.tensor([[7.378307032013254e-08], [6.804029339946283e-08], [8.428627751300155e-08]], dtype=torch.float32),
    'grad_b1': torch.tensor([4.841634648755644e-08, 4.354341243129056e-08, 4.625250937806413e-08], dtype=torch.float32),
    'grad_w2': torch.tensor([[2.618716337110527e-07, 2.926922206825111e-07, 2.978876523229701e-07]], dtype=torch.float32),
    'grad_b2': torch.tensor([1.0850219922531323e-07], dtype=torch.float32),
}
OUTPUT_LAYOUTS = {'y': ('replicate',),
 'grad_x': ('replicate',),
 'grad_w1': ('shard', 0, 'dtensor'),
 'grad_b1': ('shard', 0, 'dtensor'),
 'grad_w2': ('shard', 1, 'dtensor'),
 'grad_b2': ('replicate',)}


def split(size, parts, rule):
    """Shard sizes: DTensor's rule (ceil(size / parts) until they run out) or torch.tensor_split's."""
    if rule == "dtensor":
        chunk = -(-size // parts)
        return [max(0, min(chunk, size - chunk * r)) for r in range(parts)]
    return [size // parts + (r < size % parts) for r in range(parts)]


def piece(value, layout, rank, parts):
    if layout[0] != "shard":
        return value
    dim, rule = layout[1], layout[2]
    if len(layout) > 3 and layout[3] > 1:  # a fused dim: this rank's shard of each equal block, in order
        m = value.shape[dim] // layout[3]
        blocks = [piece(value.narrow(dim, b * m, m), layout[:3], rank, parts) for b in range(layout[3])]
        return torch.cat(blocks, dim=dim)
    sizes = split(value.shape[dim], parts, rule)
    return value.narrow(dim, sum(sizes[:rank]), sizes[rank])


class Mesh:
    def __init__(self, shape, device, rank):
        self.shape, self.device = tuple(shape), device
        # this rank's place on the mesh and the global ranks of its group along each axis, as
        # shardfuzz's ctx.mesh has them (torch's TP and FSDP2 targets read ranks[-1])
        grid = torch.arange(torch.Size(self.shape).numel()).view(self.shape)
        self.coords = tuple(int(c) for c in (grid == rank).nonzero()[0])
        self.ranks = tuple(
            tuple(grid[self.coords[:axis] + (slice(None),) + self.coords[axis + 1 :]].tolist())
            for axis in range(len(self.shape))
        )

    def device_mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        names = (*(f"axis{i}" for i in range(len(self.shape) - 1)), "impl")
        return init_device_mesh(self.device.type, self.shape, mesh_dim_names=names)


class Ctx:
    """What shardfuzz hands the implementation, cut down to this case."""

    def __init__(self, device):
        shape = CASE["mesh"]
        self.case = type("Case", (), dict(CASE, group_size=shape[-1]))()
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = device
        # the group under test: this rank's row of the mesh's last axis
        rows = [list(range(s, s + shape[-1])) for s in range(0, self.world_size, shape[-1])]
        groups = [dist.new_group(r) for r in rows]
        self.group = groups[self.rank // shape[-1]]
        self.group_rank, self.group_size = self.rank % shape[-1], shape[-1]
        self.inputs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in INPUTS.items()}
        self.mesh = Mesh(shape, device, self.rank)

    def shard(self, value, layout):
        spec = ("shard", layout.dim, getattr(layout, "rule", "dtensor"), getattr(layout, "blocks", 1))
        return piece(value, spec, self.group_rank, self.group_size)


def check(ctx, outputs):
    wrong = []  # every wrong output of this rank, in the target's order, as the report lists them
    for name, layout in OUTPUT_LAYOUTS.items():
        got = outputs[name]
        if got is None or EXPECTED[name] is None:  # "no value" on both sides is nothing to compare
            if (got is None) != (EXPECTED[name] is None):
                raise AssertionError(f"rank {ctx.rank}: output {name!r} is {got!r}, expected {EXPECTED[name]!r}")
            continue
        if hasattr(got, "full_tensor"):  # a DTensor: its local piece where it says, then the whole value
            got = got.full_tensor()
        elif layout[0] == "partial":
            got = got.clone()
            dist.all_reduce(got, group=ctx.group)
        want = piece(EXPECTED[name], ("replicate",) if hasattr(outputs[name], "full_tensor") else layout,
                     ctx.group_rank, ctx.group_size)
        if tuple(got.shape) != tuple(want.shape):  # a wrong shape would broadcast in the comparison
            raise AssertionError(f"rank {ctx.rank}: output {name!r} has shape {list(got.shape)}, expected {list(want.shape)}")
        if name not in ALLOWED:
            if not torch.equal(got.cpu(), want):
                wrong.append(f"rank {ctx.rank}: {name} = {got}, expected {want}")
            continue
        allowed = piece(ALLOWED[name], ("replicate",) if hasattr(outputs[name], "full_tensor") else layout,
                        ctx.group_rank, ctx.group_size).double()
        err = (got.detach().cpu().double() - want).abs()
        bad = ~(err <= allowed)
        if bad.any():
            ratio = (err / allowed).nan_to_num(float("inf")).max().item()
            wrong.append(
                f"rank {ctx.rank}: output {name!r}: {int(bad.sum())} of {err.numel()} elements wrong, "
                f"worst {ratio:.3g}x the allowed error\n  got      {got}\n  expected {want}"
            )
    if wrong:
        raise AssertionError("\n".join(wrong))
    print(f"rank {ctx.rank}: all outputs within the allowed error", flush=True)


# a rank stuck in a collective (a hang) fails after this instead of waiting for the default timeout
COLLECTIVE_TIMEOUT_S = 120


def main():
    backend = sys.argv[sys.argv.index("--backend") + 1] if "--backend" in sys.argv else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        ctx = Ctx(device)
        # the random state the ranks had: an implementation that draws (an init, a dropout) draws the same
        torch.manual_seed(CASE["seed"])
        random.seed(CASE["seed"])
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(CASE["seed"] % 2**32)
        check(ctx, torch_tp(ctx, **{}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
