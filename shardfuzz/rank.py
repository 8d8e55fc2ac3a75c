"""What runs inside a rank for one task: the mesh, the context, the implementation.

:class:`RankState` is a rank's long-lived state (its meshes and the targets and implementations it
imported); :func:`run_task` runs one :class:`~shardfuzz.protocol.Task` and returns its
:class:`~shardfuzz.protocol.Reply`. Pool workers (:mod:`shardfuzz.worker`) and torchrun ranks
(:mod:`shardfuzz.torchrun`) both call it.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import math
import os
import random
import time
import warnings
from typing import TYPE_CHECKING, Any

from shardfuzz.protocol import Reply, Task, encode
from shardfuzz.refs import load_ref
from shardfuzz.registry import resolve_worker_target

if TYPE_CHECKING:
    import torch

IGNORED_COLLECTIVE_WARNING = "an autograd kernel was not registered to the Autograd key"


@dataclasses.dataclass
class Mesh:
    """The case's mesh as process groups. The implementation runs on the last axis."""

    shape: tuple[int, ...]
    coords: tuple[int, ...]
    groups: tuple[Any, ...]  # this rank's process group along each axis
    ranks: tuple[tuple[int, ...], ...]  # global ranks of this rank's group along each axis
    device_type: str = "cpu"
    _device_mesh: Any = None

    def device_mesh(self):
        """This rank's :class:`torch.distributed.device_mesh.DeviceMesh` over the whole mesh, with
        axes named ``axis0, ...`` and ``impl`` (the last one, under test)."""
        if self._device_mesh is None:
            import torch
            from torch.distributed.device_mesh import DeviceMesh

            names = (*(f"axis{i}" for i in range(len(self.shape) - 1)), "impl")
            mesh = torch.arange(math.prod(self.shape)).view(self.shape)
            self._device_mesh = DeviceMesh.from_group(
                list(self.groups), self.device_type, mesh=mesh, mesh_dim_names=names
            )
        return self._device_mesh


@dataclasses.dataclass
class RankContext:
    """What an implementation gets on each rank.

    Attributes:
        case: the :class:`~shardfuzz.Case`.
        rank, world_size: global rank and world size.
        group: the process group of the mesh axis under test (the last axis). Use it, and only it,
            for the implementation's collectives: never the world group by default.
        group_rank, group_size: this rank's place in ``group``.
        mesh: the :class:`Mesh` (all axes, their groups, this rank's coordinates);
            ``mesh.device_mesh()`` is the same as a DeviceMesh.
        inputs: the full inputs (identical on every rank), on ``device``.
        local: the inputs sharded by the target's ``input_layouts`` (replicated when not listed).
        device: ``torch.device`` of this rank.
        world_group: the pool's default group (for targets that really need the whole world).
    """

    case: Any
    rank: int
    world_size: int
    group: Any
    group_rank: int
    group_size: int
    mesh: Mesh
    inputs: dict[str, Any]
    local: dict[str, Any]
    device: Any
    world_group: Any

    def shard(self, value: Any, layout: Any) -> Any:
        """This rank's piece of a full ``value`` under ``layout`` (e.g. ``Shard(0)``)."""
        return layout.piece(value, self.group_rank, self.group_size)

    @property
    def dtype(self):
        import torch

        return getattr(torch, self.case.dtype)


def select_device(backend: str, device: str, rank: int) -> torch.device:
    """One CUDA device per rank for nccl (and for gloo on CUDA tensors); the CPU otherwise."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic mode
    if backend == "nccl" or device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def numerics_flags() -> dict[str, Any]:
    """The settings that change floating-point results, for reports and failure files."""
    import torch

    matmul = torch.backends.cuda.matmul
    flags: dict[str, Any] = {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cuda_matmul_allow_tf32": matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "cuda_bf16_reduced_precision_reduction": matmul.allow_bf16_reduced_precision_reduction,
        "cuda_fp16_reduced_precision_reduction": matmul.allow_fp16_reduced_precision_reduction,
    }
    for name in ("flash", "mem_efficient", "math", "cudnn"):
        fn = getattr(torch.backends.cuda, f"{name}_sdp_enabled", None)
        if fn is not None:
            flags[f"sdpa_{name}_enabled"] = bool(fn())
    return flags


class RankState:
    """A rank's long-lived state: who it is, its meshes (cached by shape and timeout), and the
    targets and implementations it has imported."""

    def __init__(self, rank: int, world_size: int, device: Any, default_timeout: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.default_timeout = default_timeout  # the world group's timeout
        self.meshes: dict[tuple, Mesh] = {}
        self.targets: dict[str, Any] = {}
        self.impls: dict[str, Any] = {}

    def mesh(self, shape: tuple[int, ...], timeout_s: float) -> Mesh:
        key = (shape, timeout_s)
        if key in self.meshes:
            return self.meshes[key]
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=timeout_s)
        n = math.prod(shape)
        coords = _unravel(self.rank, shape)
        groups, ranks = [], []
        for axis in range(len(shape)):
            mine: tuple[Any, tuple[int, ...]] | None = None
            # every rank must call new_group for every group, in the same order
            for other in itertools.product(
                *[range(s) if i != axis else range(1) for i, s in enumerate(shape)]
            ):
                members = [_ravel((*other[:axis], k, *other[axis + 1 :]), shape) for k in range(shape[axis])]
                if len(members) == n and shape[axis] == n and timeout_s == self.default_timeout:
                    g = dist.group.WORLD
                else:
                    g = dist.new_group(members, timeout=timeout)
                if self.rank in members:
                    mine = (g, tuple(members))
            assert mine is not None
            groups.append(mine[0])
            ranks.append(mine[1])
        m = Mesh(tuple(shape), coords, tuple(groups), tuple(ranks), self.device.type)
        self.meshes[key] = m
        return m

    def target(self, ref: str) -> Any:
        if ref not in self.targets:
            self.targets[ref] = resolve_worker_target(ref)
        return self.targets[ref]

    def impl(self, ref: str) -> Any:
        if ref not in self.impls:
            self.impls[ref] = load_ref(ref, "impl")
        return self.impls[ref]


def run_task(state: RankState, task: Task) -> Reply:
    """Run one task on this rank: reset state, build inputs and shards, call the implementation."""
    import numpy as np
    import torch
    import torch.distributed as dist

    case = task.case
    target = state.target(task.target_ref)
    impl = state.impl(task.impl.ref)
    mesh = state.mesh(tuple(case.mesh), task.timeout)
    group_rank, group_size = mesh.coords[-1], case.mesh[-1]

    # reset state so a failure replays identically
    if torch.are_deterministic_algorithms_enabled() != task.deterministic:
        torch.use_deterministic_algorithms(task.deterministic)  # the setter pulls in lazy imports
    torch.manual_seed(case.seed)
    random.seed(case.seed)
    np.random.seed(case.seed % (2**32))
    torch.set_grad_enabled(True)

    inputs = target.inputs(case)
    if state.device.type != "cpu":
        inputs = {k: (v.to(state.device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    local = {
        k: (target.input_layout(k).piece(v, group_rank, group_size) if isinstance(v, torch.Tensor) else v)
        for k, v in inputs.items()
    }
    ctx = RankContext(
        case=case,
        rank=state.rank,
        world_size=state.world_size,
        group=mesh.groups[-1],
        group_rank=group_rank,
        group_size=group_size,
        mesh=mesh,
        inputs=inputs,
        local=local,
        device=state.device,
        world_group=dist.group.WORLD,
    )
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = impl(ctx, **dict(task.impl.kwargs))
    elapsed = time.perf_counter() - t0
    ignored = tuple(str(w.message) for w in caught if IGNORED_COLLECTIVE_WARNING in str(w.message))
    for w in caught:
        if IGNORED_COLLECTIVE_WARNING not in str(w.message):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if not isinstance(out, dict):
        raise TypeError(
            f"implementation {task.impl} returned {type(out).__name__}, expected a dict of outputs"
        )
    return Reply(encode(out), elapsed, ignored, numerics_flags() if task.want_flags else None)


def _unravel(r: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for s in reversed(shape):
        coords.append(r % s)
        r //= s
    return tuple(reversed(coords))


def _ravel(coords: tuple[int, ...], shape: tuple[int, ...]) -> int:
    r = 0
    for c, s in zip(coords, shape):
        r = r * s + c
    return r
