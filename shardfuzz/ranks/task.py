"""What runs inside a rank for one task: the mesh, the context, the implementation.

:class:`RankState` is a rank's long-lived state (its meshes and the targets and implementations it
imported); :func:`run_task` runs one :class:`~shardfuzz.protocol.Task` and returns its
:class:`~shardfuzz.protocol.Reply`. Pool workers (:mod:`shardfuzz.ranks.worker`) and torchrun ranks
(:mod:`shardfuzz.repro.torchrun`) both call it.

A clean rank for every example: after each one, torch's global settings (:func:`torch_settings`)
and the environment and working directory (:class:`~shardfuzz.ranks.faults.ProcessState`) that changed
are named in the reply's ``leaks`` and restored; process groups, threads and file descriptors left
behind (:data:`RESOURCES`) are named too and cannot be undone, so the reply asks for a restart.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import itertools
import math
import os
import random
import socket
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh

from shardfuzz.errors import ImplementationReturnError, RankSetupError
from shardfuzz.protocol import Reply, Task, encode, numerics_flags
from shardfuzz.ranks.faults import ProcessState
from shardfuzz.ranks.spawn import open_fds, os_threads
from shardfuzz.ranks.trace import TRACER
from shardfuzz.spec.inputs import seed_global
from shardfuzz.spec.layouts import strided_view
from shardfuzz.spec.placements import describe as describe_dtensor
from shardfuzz.spec.placements import local_input
from shardfuzz.spec.refs import load_ref
from shardfuzz.spec.registry import resolve_worker_target

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

    def device_mesh(self) -> Any:
        """This rank's :class:`torch.distributed.device_mesh.DeviceMesh` over the whole mesh, with
        axes named ``axis0, ...`` and ``impl`` (the last one, under test)."""
        if self._device_mesh is None:
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
        world_group: the group of all the case's ranks (for targets that really need the whole
            world): the pool's default group; on rank servers that torchrun started, the first
            ``world_size`` ranks of its world.
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
    def dtype(self) -> torch.dtype:
        return getattr(torch, self.case.dtype)


def select_device(backend: str, device: str, rank: int) -> torch.device:
    """One CUDA device per rank for nccl (and for gloo on CUDA tensors); the CPU otherwise."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # needed by deterministic mode
    if backend == "nccl" or device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


Setting = tuple[str, Callable[[], Any], Callable[[Any], Any]]


_SIMPLE = (
    ("get_default_dtype", "set_default_dtype"),
    ("is_grad_enabled", "set_grad_enabled"),
    ("get_float32_matmul_precision", "set_float32_matmul_precision"),
    ("get_num_threads", "set_num_threads"),
    ("get_num_interop_threads", "set_num_interop_threads"),
)


def torch_settings() -> list[Setting]:
    """The global torch settings an example must leave as it found them: (name, getter, setter)."""
    det = torch.use_deterministic_algorithms
    settings: list[Setting] = [(f"torch.{g}()", getattr(torch, g), getattr(torch, s)) for g, s in _SIMPLE]
    settings += [
        (
            "(torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())",
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda v: torch.set_anomaly_enabled(*v),
        ),
        (
            "(torch.are_deterministic_algorithms_enabled(), ..._warn_only_enabled())",
            lambda: (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            lambda v: det(v[0], warn_only=v[1]),
        ),
    ]
    settings += [
        (f"torch.backends.cudnn.{n}", *_attribute(torch.backends.cudnn, n))
        for n in ("deterministic", "benchmark")
    ]
    if hasattr(torch, "get_default_device"):  # torch >= 2.3
        cpu = torch.device("cpu")
        set_device = lambda d: torch.set_default_device(None if d == cpu else d)
        settings.append(("torch.get_default_device()", torch.get_default_device, set_device))
    return settings


def _attribute(obj: Any, name: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    def put(value: Any) -> None:
        setattr(obj, name, value)

    return (lambda: getattr(obj, name)), put


def _process_groups() -> int:
    return len(getattr(getattr(c10d, "_world", None), "pg_map", None) or {})


#: what an example must not leave behind, which no rank can undo: (noun, plural, counter)
RESOURCES = (
    ("process group", "process groups", _process_groups),
    ("thread", "threads", os_threads),
    ("open file descriptor", "open file descriptors", open_fds),
)


class RankState:
    """A rank's long-lived state: who it is, its meshes (cached by shape and timeout), and the
    targets and implementations it has imported."""

    def __init__(self, rank: int, world_size: int, device: Any, default_timeout: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.default_timeout = default_timeout  # the world group's timeout
        self.meshes: dict[tuple, Mesh | None] = {}
        self.worlds: dict[tuple, Any] = {}  # groups of the first w ranks of a larger (torchrun) world
        self.targets: dict[str, Any] = {}
        self.impls: dict[str, Any] = {}
        self.settings: list[Setting] = torch_settings()
        self.process = ProcessState(f"rank {rank}")  # os.environ and the working directory
        #: (implementation, mesh, timeout): the case groups an implementation has run on; its first
        #: example on new ones may initialise lazily (threads, fds, groups of its own made from them)
        self.warm: set[tuple[str, tuple[int, ...], float]] = set()
        #: what the last example left behind, and whether that needs a fresh rank
        self.leaks: tuple[str, ...] = ()
        self.restart = False
        self.old_groups: list[Any] = []  # weak references to the groups a regroup left (worker.leave)

    def mesh(self, shape: tuple[int, ...], timeout_s: float) -> Mesh | None:
        """The mesh ``shape`` over the first ``prod(shape)`` ranks (all of a local pool's; a
        torchrun world may be larger), made once per timeout and cached. Every rank of the world
        calls this for every mesh, in the same order (new_group is collective); a rank outside the
        mesh only takes part and gets None."""
        key = (shape, timeout_s)
        if key in self.meshes:
            return self.meshes[key]

        timeout = datetime.timedelta(seconds=timeout_s)
        n = math.prod(shape)
        cells = list(itertools.product(*(range(s) for s in shape)))  # row-major: global rank order
        whole = n == self.world_size and timeout_s == self.default_timeout
        groups, ranks = [], []
        for axis in range(len(shape)):
            mine: tuple[Any, tuple[int, ...]] | None = None
            # every rank must call new_group for every group, in the same order
            for other in itertools.product(
                *[range(s) if i != axis else range(1) for i, s in enumerate(shape)]
            ):
                members = [cells.index((*other[:axis], k, *other[axis + 1 :])) for k in range(shape[axis])]
                if len(members) == n and whole:
                    g = dist.group.WORLD
                else:
                    g = dist.new_group(members, timeout=timeout)
                if self.rank in members:
                    mine = (g, tuple(members))
            if mine is not None:
                groups.append(mine[0])
                ranks.append(mine[1])
        m = (
            Mesh(tuple(shape), cells[self.rank], tuple(groups), tuple(ranks), self.device.type)
            if groups
            else None
        )
        self.meshes[key] = m
        return m

    def world_group(self, world_size: int, timeout_s: float) -> Any:
        """The group of the first ``world_size`` ranks: the default group when that is the whole
        world (a local pool's always is), else one made by every rank of the world, once."""
        if world_size == self.world_size:
            return dist.group.WORLD
        key = (world_size, timeout_s)
        if key not in self.worlds:
            self.worlds[key] = dist.new_group(
                list(range(world_size)), timeout=datetime.timedelta(seconds=timeout_s)
            )
        return self.worlds[key]

    def snapshot(self) -> tuple[list[Any], list[int]]:
        self.process.snapshot()
        return [get() for _, get, _ in self.settings], [count() for *_, count in RESOURCES]

    def clean_up(
        self, before: tuple[list[Any], list[int]], warm_key: tuple[str, tuple[int, ...], float]
    ) -> None:
        """Restore the settings an example changed and name every leak (``self.leaks``); a
        resource leak, or a setting that cannot be restored, sets ``self.restart``."""
        leaks, restart = self.process.restore(), False
        for (name, get, set_), old in zip(self.settings, before[0]):
            new = get()
            if new != old:
                leaks.append(f"rank {self.rank} left {name} = {new!r}")
                try:
                    set_(old)
                except Exception:  # noqa: BLE001 (a global setter raises what it raises, e.g. interop threads once parallel work started: the pool restarts)
                    restart = True
        counts = [count() for *_, count in RESOURCES]
        first = warm_key not in self.warm  # lazy initialisation may add threads or fds once
        self.warm.add(warm_key)
        if counts != before[1] and not first:
            gc.collect(1)  # young garbage may still hold a group or a file (a full collection: ~0.1 s)
            counts = [count() for *_, count in RESOURCES]
        for (noun, plural, _), old, new in zip(RESOURCES, before[1], counts):
            if new < old and noun == "process group":
                leaks.append(f"rank {self.rank} destroyed {old - new} {noun if old - new == 1 else plural}")
            elif new > old and not first:
                leaks.append(f"rank {self.rank} left {new - old} more {noun if new - old == 1 else plural}")
            else:
                continue
            restart = True
        self.leaks, self.restart = tuple(leaks), restart

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
    case = task.case
    state.leaks, state.restart = (), False
    try:
        target = state.target(task.target_ref)
        impl = state.impl(task.impl.ref)
    # any exception: whatever importing the user's module raises; the driver loaded it, so this
    # rank's environment differs (a file missing on another node)
    except Exception as e:
        raise RankSetupError(
            f"rank {state.rank} on host {socket.gethostname()} could not load what the driver loaded: "
            f"{type(e).__name__}: {e}"
        ) from e
    mesh = state.mesh(tuple(case.mesh), task.timeout)
    if mesh is None:  # only a rank server outside the case's ranks, which the driver never sends it
        raise RuntimeError(f"rank {state.rank} is not one of the case's {case.world_size} ranks")
    world_group = state.world_group(case.world_size, task.timeout)

    # reset state so a failure replays identically
    if torch.are_deterministic_algorithms_enabled() != task.deterministic:
        torch.use_deterministic_algorithms(task.deterministic)  # preloaded by the forkserver
    seed_global(case.seed, state.device.type)
    random.seed(case.seed)
    np.random.seed(case.seed % (2**32))
    torch.set_grad_enabled(True)
    before = state.snapshot()
    # a case smaller than a torchrun world (rank servers): the default group is the case's ranks
    # while it runs, so that code written for a world of its own (dist.get_world_size(), a
    # collective without a group, init_device_mesh) sees exactly that, as on a local pool
    subworld = world_group is not dist.group.WORLD
    default, count = c10d._world.default_pg, c10d._world.group_count
    if subworld:
        c10d._world.default_pg = world_group
    try:
        reply = _run(state, task, target, impl, mesh, world_group)
    finally:  # also when the implementation raised (Unsupported keeps the pool)
        if subworld:
            c10d._world.default_pg = default
        # keyed by the timeout too: the groups of a case are made per timeout (they carry it), so a
        # timeout learnt under load hands the implementation new group objects, and one that
        # derives groups of its own from them (FSDP2's HSDP mesh) makes them again, once
        state.clean_up(before, (str(task.impl), tuple(case.mesh), task.timeout))
    if subworld and c10d._world.group_count != count:  # the ranks outside the case made none:
        # group names (a count) no longer match across the world, so it restarts
        state.leaks += (f"rank {state.rank} made process groups over a case's ranks only",)
        state.restart = True
    if state.leaks:
        reply = dataclasses.replace(reply, leaks=state.leaks, restart=state.restart)
    return reply


def _run(state: RankState, task: Task, target: Any, impl: Any, mesh: Mesh, world_group: Any) -> Reply:
    case = task.case
    group_rank, group_size = mesh.coords[-1], case.mesh[-1]
    inputs = target.inputs(case)
    if state.device.type != "cpu":
        inputs = {k: (v.to(state.device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    local = {
        k: (
            local_input(target.input_layout(k), v, mesh, group_rank, group_size)
            if isinstance(v, torch.Tensor)
            else v
        )
        for k, v in inputs.items()
    }
    if case.options.get("strided"):  # the layout-free inputs as non-contiguous views, same values
        for k in target.layout_free:
            if type(local.get(k)) is torch.Tensor:  # a DTensor input keeps its own layout
                local[k] = strided_view(local[k])
    ctx = RankContext(  # the fields in order: case, rank, world_size, group, ..., world_group
        *(case, state.rank, case.world_size, mesh.groups[-1], group_rank, group_size, mesh),
        *(inputs, local, state.device, world_group),
    )
    t0 = time.perf_counter()
    TRACER.start(task.trace)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = impl(ctx, **dict(task.impl.kwargs))
    finally:
        trace = TRACER.stop()
    elapsed = time.perf_counter() - t0
    ignored = tuple(str(w.message) for w in caught if IGNORED_COLLECTIVE_WARNING in str(w.message))
    for w in caught:
        if IGNORED_COLLECTIVE_WARNING not in str(w.message):
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if not isinstance(out, dict):
        raise ImplementationReturnError(
            f"implementation {task.impl} returned {type(out).__name__}, expected a dict of outputs"
        )
    out = {k: describe_dtensor(v) for k, v in out.items()}  # a DTensor travels with its placements
    flags = numerics_flags() if task.want_flags else None
    return Reply(encode(out), elapsed, ignored, flags, trace=trace)
