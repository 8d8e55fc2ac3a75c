"""Reproducer: dtensor_ops / torch_inplace_squeeze (layout).

1 rank(s), mesh (1,); sizes d0=1, d1=1, d2=1; float32; options {'op': 'aten.squeeze_.dim', 'ndim': 1, 'place': 'R', 'other_place': 'R', 'backward': False, 'dim': 0, 'dim2': 0, 'dims': '[0]', 'all_dims': False, 'flag0': False, 'flag1': False, 'flag2': False, 'scalar': 0.5, 'scalar2': 0.5, 'small_int': 0, 'perm': '[0]', 'result_dtype': None, 'ord': '2'}.
Run: torchrun --nproc-per-node=1 repro_dtensor_ops_torch_inplace_squeeze.py    (add --backend nccl for GPUs)
Needs only torch (written with torch 2.13.0+cpu by shardfuzz 0.1.0 on 2026-12-07). Each rank runs the
implementation below on its inputs and compares its outputs with the oracle's float64 values,
within the tolerance shardfuzz allows a mismatch after its recheck (a report of a mismatch far
past it shows the narrower bound before the recheck, which it skips there); every wrong output of
a rank, or an error, fails the run. A rank stuck in a collective (a hang) fails after
COLLECTIVE_TIMEOUT_S seconds instead of waiting forever.
"""

from typing import Any
import collections
import dataclasses
import datetime
import functools
import json
import math
import os
import random
import re
import sys
import torch
import torch.distributed as dist


class Unsupported(Exception):
    """The implementation refuses this case (shardfuzz counts it; here it is an error)."""

    def __init__(self, message, reason=None):
        super().__init__(message)


# -- the implementation under test --------------------------------------------------------------
def clear_sharding_caches() -> None:
    """Empty DTensor's sharding-propagation caches: this target calls hundreds of ops with drawn
    arguments, and a cache key that misses one (topk's ``k`` in torch 2.13) hands a case the output
    spec of an earlier example's call, a finding its case alone passes. Each case starts empty so
    a finding replays; the engine keeps the caches for other targets (FSDP2 ran 75% slower)."""
    from torch.distributed.tensor import debug

    clear = getattr(debug, "_clear_sharding_prop_cache", None)  # torch's own: both caches
    if clear is not None:
        clear()
        return
    # an older torch: its caches by the names they had (a ``LocalLRUCache`` without
    # ``cache_clear`` keeps its ``lru_cache`` as ``.cache``); where none can be cleared, the
    # caches carry over, as before this reset
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    for name in ("propagate_op_sharding", "_propagate_tensor_meta"):
        cache = getattr(propagator, name, None)
        for owner in (cache, getattr(cache, "cache", None)):
            cache_clear = getattr(owner, "cache_clear", None)
            if callable(cache_clear):
                cache_clear()
                break


def _cut(t, offset, size):
    return t[tuple(slice(o, o + s) for o, s in zip(offset, size))]


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


def split_offsets(size: int, parts: int, rule: str = "dtensor") -> list[int]:
    """Start offset of each shard."""
    sizes = split_sizes(size, parts, rule)
    return [sum(sizes[:i]) for i in range(parts)]


def _box(shape, placed, mesh_shape, coord):
    offset, size = [0] * len(shape), list(shape)
    for axis, p in enumerate(placed):
        if p.startswith("S"):
            d, n, c = int(p[1:]), mesh_shape[axis], coord[axis]
            offset[d] += split_offsets(size[d], n, "dtensor")[c]
            size[d] = split_sizes(size[d], n, "dtensor")[c]
    return offset, size


def placed_piece(full, owner, placed, mesh_shape, coord):
    """This coordinate's local piece of ``full``: its shard, and under a Partial a term that the
    Partial's reduction turns back into ``full`` exactly (see the module)."""
    local = _cut(full, *_box(tuple(full.shape), placed, mesh_shape, coord)).clone()
    kinds = {p for p in placed if p.startswith("P")}
    if not kinds or local.numel() == 0:
        return local.contiguous()
    (kind,) = kinds
    if kind == "Pavg":
        return local.contiguous()
    parts = [mesh_shape[a] for a, p in enumerate(placed) if p.startswith("P")]
    flat = 0
    for a, p in enumerate(placed):
        if p.startswith("P"):
            flat = flat * mesh_shape[a] + coord[a]
    keep = _cut(owner, *_box(tuple(full.shape), placed, mesh_shape, coord)) % math.prod(parts) == flat
    if kind == "Psum":  # -0.0, a sum's identity: x + -0.0 is x exactly, a -0.0 (signed_zero) too
        other = torch.full_like(local, -0.0)
    elif kind == "Pprod":  # x * 1 is x exactly, whatever the order
        other = torch.ones_like(local)
    else:  # strictly below (max) or above (min): rounding is monotone, so never past x
        step = 1 + local.double().abs()
        other = (local.double() - step if kind == "Pmax" else local.double() + step).to(local.dtype)
    return torch.where(keep, local, other).contiguous()


def places(case, key="place") -> tuple[str, ...]:
    return tuple(case.options[key].split(","))


def _coord(mesh):
    return tuple(mesh.get_coordinate())


def torch_placements(placed):
    from torch.distributed.tensor import Partial, Replicate, Shard

    reduce = {"Psum": "sum", "Pavg": "avg", "Pmax": "max", "Pmin": "min", "Pprod": "product"}
    return [
        Replicate() if p == "R" else Partial(reduce[p]) if p in reduce else Shard(int(p[1:])) for p in placed
    ]


def _dtensor(ctx, name, key):
    from torch.distributed.tensor import DTensor

    mesh = ctx.mesh.device_mesh()
    full, placed = ctx.inputs[name], places(ctx.case, key)
    local = placed_piece(full, ctx.inputs[f"{name}_owner"], placed, tuple(mesh.shape), _coord(mesh))
    shape = tuple(full.shape)
    return DTensor.from_local(
        local,
        mesh,
        torch_placements(placed),
        run_check=False,
        shape=shape,
        stride=torch.empty(shape).stride(),
    )


@dataclasses.dataclass(frozen=True)
class Arg:
    name: str
    kind: str
    kwarg_only: bool
    position: int = 0  # among the positional arguments after ``self`` (kwarg-only ones: unused)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str  # "aten.sum.dim_IntList"
    args: tuple[Arg, ...]
    inplace: bool
    differentiable: bool = False  # its first result has a gradient (set by ``generate``)
    #: the schema's default of each positional argument after ``self``: one left at its default
    #: still takes its place when a later one is drawn (``amax.default(x, [], keepdim)``: passing
    #: keepdim second made it the dim)
    defaults: tuple[Any, ...] = ()

    @property
    def op(self) -> Any:
        _, packet, overload = self.name.split(".")
        return getattr(getattr(torch.ops.aten, packet), overload)

    @property
    def has_other(self) -> bool:
        return any(a.kind == "other" for a in self.args)

    @property
    def has_dims(self) -> bool:
        return any(a.kind in ("dim", "dims", "dims?", "perm") for a in self.args)


ARG_KINDS = {
    "int": "dim",  # a dim unless the name says otherwise (``NAMED_INTS``)
    "List[int]": "dims",  # a list of distinct dims, unless it is a size (``SIZE_NAMES``) or ``perm``
    "Optional[List[int]]": "dims?",
    "bool": "flag",
    "number": "scalar",  # a Scalar
    "Tensor": "other",
    "Optional[int]": "dtype?",  # only an argument named dtype (``DTYPE_ARGS``): the result's dtype
}


DTYPE_ARGS = frozenset({"dtype"})


NORM_ORDER_ARGS = frozenset({"p", "ord"})


def _kind_of(arg: Any) -> str | None:
    """The kind of a schema argument by its type, and by its name where that says more."""
    kind = ARG_KINDS.get(str(arg.type))
    if kind == "dtype?" and arg.name not in DTYPE_ARGS:
        return None
    if kind == "scalar" and arg.name in NORM_ORDER_ARGS:
        return "ord"
    return kind


ARG_OPTIONS = {"dim": ("dim", "dim2"), "flag": ("flag0", "flag1", "flag2"), "scalar": ("scalar", "scalar2")}


NAMED_INTS = {"k": (1, 2), "index": (0, 1), "decimals": (0, 1), "diagonal": (0, 1), "offset": (0, 1)}


SIZE_NAMES = frozenset("size shape stride sizes repeats pad split_sizes output_size normalized_shape".split())


FIXED_FALSE = frozenset({"half_to_float"})


def _drawn_args(base: str, args: Any) -> tuple[Arg, ...] | str:
    """The arguments after ``self`` a case draws (those with a default left out, but optional dim
    lists and flags), or why the op cannot be drawn."""
    drawn = []
    positions = {a.name: i for i, a in enumerate(x for x in args if not x.kwarg_only)}
    for a in args:
        t = str(a.type)
        kind = _kind_of(a)
        if a.has_default_value() and kind not in ("dims?", "flag", "dtype?", "ord"):
            continue  # left at its default
        if kind is None:
            return f"argument type {t}"
        if kind == "dim" and a.name in NAMED_INTS:
            kind = f"int:{a.name}"
        if kind == "dims" and a.name in SIZE_NAMES:
            return "a size or shape argument"
        if kind == "dims" and base == "permute":
            kind = "perm"
        if kind == "flag" and a.name in FIXED_FALSE:
            kind = "false"
        drawn.append(Arg(a.name, kind, a.kwarg_only, positions.get(a.name, 0)))
    if sum(a.kind == "other" for a in drawn) > 1:
        return "more than one tensor argument"
    for kind, names in ARG_OPTIONS.items():
        if sum(a.kind == kind for a in drawn) > len(names):
            return f"more than {len(names)} arguments of kind {kind}"
    return tuple(drawn)


NOT_A_FUNCTION = re.compile(
    r"rand|dropout|bernoulli|normal|uniform|multinomial|exponential|cauchy|geometric|random|empty|"
    r"new_|_like$|fill|zero|copy|^set_|resize|as_strided|scatter|index_put|"
    r"nonzero|masked_scatter|detach|alias|lift|clone|view_as|to$|view$|rrelu"
)


INTERNAL_DRAWN = frozenset({"_softmax", "_log_softmax"})


MASKS_IN_PLACE = re.compile(r"^(eq|ne|lt|le|gt|ge|logical_and|logical_or|logical_xor|logical_not)_$")


OTHER_FAMILIES = re.compile(
    r"^(linalg_(?!vector_norm)|special_|cholesky|triangular|lu_|geqrf|ormqr|grid_sampler|histc|bucketize|"
    r"embedding|polygamma|mvlgamma|igamma|nextafter|frexp|bitwise_|gcd|lcm|ldexp|i0|lgamma|digamma|"
    r"erfinv|logit|mode|median|nanmedian|kthvalue|float_power|pow|xlogy|heaviside|fmod|remainder|"
    r"mm$|bmm|addmm|baddbmm|dot|diag)"
)


INTERNAL = re.compile(r"_backward|foreach|^_|native_")


def _spec(op: Any) -> OpSpec | str:
    """The op as a case can draw it, or why not."""
    if getattr(op, "namespace", "") != "aten":
        return "not an aten op"
    schema = op._schema
    base = schema.name.split("::")[1]
    if NOT_A_FUNCTION.search(base):
        return "not a function of its input"
    if INTERNAL.search(base) and base not in INTERNAL_DRAWN:
        return "an internal or backward variant"
    if MASKS_IN_PLACE.match(base):
        return "a 0/1 mask written in place"
    if OTHER_FAMILIES.search(base):
        return "numerics or input structure of its own"
    args = schema.arguments
    if any(a.alias_info is not None and a.alias_info.is_write and a.kwarg_only for a in args):
        return "out= variant"
    if not args or str(args[0].type) != "Tensor":
        return "first argument is not a tensor"
    if not schema.returns or any(str(r.type) != "Tensor" for r in schema.returns):
        return "returns something other than tensors"
    drawn = _drawn_args(base, args[1:])
    if isinstance(drawn, str):
        return drawn
    positional = [a for a in args[1:] if not a.kwarg_only]
    defaults = tuple(a.default_value if a.has_default_value() else None for a in positional)
    return OpSpec(str(op), drawn, base.endswith("_"), defaults=defaults)


def call(spec: OpSpec, x: Any, other: Any, values: list[Any]) -> tuple[Any, ...]:
    """The op on ``x`` (a tensor or a DTensor) with ``values``, its results as a tuple."""
    positional, kwargs, used = list(spec.defaults), {}, 0
    for a, v in zip(spec.args, values):
        v = other if v == "other" else v
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            positional[a.position] = v
            used = max(used, a.position + 1)
    out = spec.op(x, *positional[:used], **kwargs)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _simplest(arg: Arg) -> Any:
    if arg.kind.startswith("int:"):
        return NAMED_INTS[arg.kind[4:]][0]
    return {
        "dim": 0,
        "dims": [0],
        "dims?": None,
        "dtype?": None,
        "perm": [1, 0],
        "flag": False,
        "false": False,
        "scalar": 0.5,
        "ord": 2.0,
        "other": "other",
    }[arg.kind]


def _runs_plain(spec: OpSpec) -> bool | None:
    """None where the op fails on a plain float tensor [3, 4] with its simplest arguments, else
    whether its first result has a gradient there."""
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    try:
        call(spec, x, x.clone(), [_simplest(a) for a in spec.args])
        if spec.inplace:
            return False
        y = call(
            spec, x.clone().requires_grad_(), x.clone().requires_grad_(), [_simplest(a) for a in spec.args]
        )[0]
    except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError):
        return None
    return bool(y.requires_grad and y.is_floating_point())


@functools.cache
def spec_named(name: str) -> OpSpec | str:
    """The aten op ``name`` ("aten.sum.dim_IntList") as a case draws it, or why it is not drawn
    (read from its schema alone: a reproducer needs no registry)."""
    namespace, _, rest = name.partition(".")
    packet, _, overload = rest.partition(".")
    op = getattr(getattr(getattr(torch.ops, namespace, None), packet, None), overload or "default", None)
    if op is None and "." not in name and hasattr(getattr(torch.ops.aten, name, None), "default"):
        # a bare name (a DTensor maintainer's op=gelu): the full one an op is drawn and pinned by
        return f"not an op of this torch as named: did you mean 'aten.{name}.default'?"
    if op is None:
        return "not an op of this torch"
    spec = _spec(op)
    if isinstance(spec, str):
        return spec
    runs = _runs_plain(spec)
    if runs is None:
        return "fails on a plain float tensor"
    return dataclasses.replace(spec, differentiable=runs)


def spec_of(case) -> OpSpec:
    spec = spec_named(case.options["op"])
    if isinstance(spec, str):  # pinned by hand (--option op=...) to an op this target cannot draw
        raise Unsupported(f"op {case.options['op']}: {spec}", reason="op not drawn")
    return spec


def backward_of(case) -> bool:
    """Whether the case runs backward: drawn, for an op with a gradient, without a max/min/product
    Partial input (whose pieces are not terms of the tensor)."""
    spec = spec_of(case)
    keys = ("place", "other_place") if spec.has_other else ("place",)
    not_terms = any(p in ("Pmax", "Pmin", "Pprod") for k in keys for p in places(case, k))
    return bool(case.options["backward"]) and spec.differentiable and not not_terms


def values_of(case) -> list[Any]:
    """The op's arguments after ``self``, read from the case's options by kind (see ``ARG_OPTIONS``)."""
    opts, seen = case.options, collections.Counter()
    values: list[Any] = []
    for a in spec_of(case).args:
        kind = a.kind
        i, seen[kind] = seen[kind], seen[kind] + 1
        if kind in ARG_OPTIONS:
            values.append(opts[ARG_OPTIONS[kind][i]])
        elif kind == "dims" or (kind == "dims?" and not opts["all_dims"]):
            values.append(json.loads(opts["dims"]))
        elif kind == "dims?":
            values.append(None)
        elif kind == "perm":
            values.append(json.loads(opts["perm"]))
        elif kind == "dtype?":
            values.append(None if opts["result_dtype"] is None else getattr(torch, opts["result_dtype"]))
        elif kind == "other":
            values.append("other")
        elif kind == "false":
            values.append(False)
        elif kind == "ord":
            values.append(float(opts["ord"]))
        else:  # a named small int: k of topk counts from 1
            lo, _ = NAMED_INTS[kind[4:]]
            values.append(lo + opts["small_int"])
    return values


def _zeros_like(d):
    from torch.distributed.tensor import Replicate, distribute_tensor

    return distribute_tensor(
        torch.zeros(d.shape, dtype=d.dtype), d.device_mesh, [Replicate()] * d.device_mesh.ndim
    )


REFUSALS = re.compile(
    r"not supported|Please redistribute|does not support|is not implemented for|"
    r"does not have a sharding strategy registered",
    re.I,
)


def _no_partial(y) -> bool:
    return not any(p.is_partial() for p in y.placements)


def torch_dtensor(ctx):
    """DTensor's op on the placed inputs, forward and (``backward``) backward."""
    clear_sharding_caches()
    case = ctx.case
    spec, values = spec_of(case), values_of(case)
    x = _dtensor(ctx, "x", "place")
    other = _dtensor(ctx, "other", "other_place")
    grad = backward_of(case)
    if grad:
        x = x.detach().requires_grad_()
        other = other.detach().requires_grad_(spec.has_other)
    try:
        ys = call(spec, x.clone() if spec.inplace else x, other, values)
        if grad:
            from torch.distributed.tensor import Replicate, distribute_tensor

            dy = distribute_tensor(ctx.inputs["dy"], ctx.mesh.device_mesh(), [Replicate()] * len(case.mesh))
            # the cotangent where the output lives (a pending Partial output takes it replicated)
            ys[0].backward(dy.redistribute(placements=ys[0].placements) if _no_partial(ys[0]) else dy)
    except (RuntimeError, NotImplementedError, ValueError, AssertionError) as e:
        if REFUSALS.search(str(e)):
            raise Unsupported(
                f"DTensor refuses {spec.name}: {str(e).splitlines()[0][:160]}", reason="DTensor refuses"
            ) from e
        raise
    out = {f"y{i}": y.detach() for i, y in enumerate(ys)}
    if grad:
        out["grad_x"] = x.grad if x.grad is not None else _zeros_like(x)
        if spec.has_other:
            out["grad_other"] = other.grad if other.grad is not None else _zeros_like(other)
    return out


# -- the case, its inputs, the oracle's values and the allowed error ----------------------------
CASE = {'world_size': 1,
 'mesh': (1,),
 'sizes': {'d0': 1, 'd1': 1, 'd2': 1},
 'dtype': 'float32',
 'options': {'op': 'aten.squeeze_.dim',
             'ndim': 1,
             'place': 'R',
             'other_place': 'R',
             'backward': False,
             'dim': 0,
             'dim2': 0,
             'dims': '[0]',
             'all_dims': False,
             'flag0': False,
             'flag1': False,
             'flag2': False,
             'scalar': 0.5,
             'scalar2': 0.5,
             'small_int': 0,
             'perm': '[0]',
             'result_dtype': None,
             'ord': '2'},
 'seed': 0}
DATA = {}
INPUTS = {
    'x': torch.tensor([1.5409960746765137], dtype=torch.float32),
    'other': torch.tensor([-0.293428897857666], dtype=torch.float32),
    'x_owner': torch.tensor([3], dtype=torch.int64),
    'other_owner': torch.tensor([59], dtype=torch.int64),
}
EXPECTED = {
    'y0': torch.tensor(1.5409960746765137, dtype=torch.float64),
}
ALLOWED = {
    'y0': torch.tensor(1.8370104726272984e-07, dtype=torch.float32),
}
OUTPUT_LAYOUTS = {'y0': ('dtensor',)}


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
    sizes = split(value.shape[dim], parts, rule)
    return value.narrow(dim, sum(sizes[:rank]), sizes[rank])


def dtensor_local_shape(d):
    """The local shape a DTensor's placements promise this rank (Shard: DTensor's chunk rule, mesh
    axes in order); None for a placement this script does not lay out (_StridedShard)."""
    shape, coord = list(d.shape), d.device_mesh.get_coordinate()
    for axis, p in enumerate(d.placements):
        if type(p).__name__ == "Shard":
            shape[p.dim] = split(shape[p.dim], d.device_mesh.size(axis), "dtensor")[coord[axis]]
        elif p.is_shard():
            return None
    return shape


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


def check(ctx, outputs):
    wrong = []  # every wrong output of this rank, in the target's order, as the report lists them
    for name, layout in OUTPUT_LAYOUTS.items():
        got = outputs[name]
        if got is None or EXPECTED[name] is None:  # "no value" on both sides is nothing to compare
            if (got is None) != (EXPECTED[name] is None):
                raise AssertionError(f"rank {ctx.rank}: output {name!r} is {got!r}, expected {EXPECTED[name]!r}")
            continue
        if hasattr(got, "full_tensor"):  # a DTensor: its local piece where it says, then the whole value
            promised = dtensor_local_shape(got)
            if promised is not None and list(got.to_local().shape) != promised:
                raise AssertionError(
                    f"rank {ctx.rank}: output {name!r} holds a local piece of shape {list(got.to_local().shape)}, "
                    f"where its placements {got.placements} on global shape {list(got.shape)} put {promised}"
                )
            got = got.full_tensor()
        elif layout[0] == "dtensor":  # declared FromDTensor(): a plain tensor breaks the contract
            raise AssertionError(f"rank {ctx.rank}: output {name!r} must be a DTensor, got {type(got).__name__}")
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
        check(ctx, torch_dtensor(ctx, **{}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
