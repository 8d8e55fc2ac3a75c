"""Code that runs inside a rank.

A worker is a forkserver child (torch preloaded). It joins the pool's process group once, then
serves examples until told to stop or until its driver goes away. Per example it:

1. builds the mesh the case asks for (process groups cached by mesh shape and timeout);
2. resets state: seeds, no leftover grads (modules are built fresh by the implementation);
3. builds the full inputs from the case seed, takes its shards, runs the implementation;
4. sends its locals back with their dtypes intact (bf16 travels as an int16 view plus a tag).
"""

from __future__ import annotations

import dataclasses
import datetime
import faulthandler
import itertools
import math
import os
import random
import signal
import sys
import threading
import time
import traceback
import warnings
from typing import Any

from shardfuzz.errors import Unsupported

IGNORED_COLLECTIVE_WARNING = "an autograd kernel was not registered to the Autograd key"
TIMEOUT_MARKERS = ("Timed out", "timed out", "Timeout")
#: a collective failed because a *peer* went away: a consequence, not the cause
PEER_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "ECONNRESET",
    "SIGABRT",
)


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
        """This rank's :class:`torch.distributed.device_mesh.DeviceMesh` over the whole mesh."""
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
        mesh: the :class:`Mesh` (all axes, their groups, this rank's coordinates).
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


def encode(value: Any) -> Any:
    """Tensors become numpy arrays tagged with their torch dtype; bf16 travels as int16 bits."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        dtype = str(t.dtype).removeprefix("torch.")
        if t.dtype == torch.bfloat16:
            arr = t.contiguous().view(torch.int16).numpy()
        else:
            arr = t.contiguous().numpy()
        return ("__tensor__", dtype, arr)
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(encode(v) for v in value)
    return value


def decode(value: Any) -> Any:
    import torch

    if isinstance(value, tuple) and len(value) == 3 and value[0] == "__tensor__":
        _, dtype, arr = value
        t = torch.from_numpy(arr.copy())
        if dtype == "bfloat16":
            t = t.view(torch.bfloat16)
        return t
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(decode(v) for v in value)
    return value


def select_device(backend: str, device: str, rank: int):
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


def _set_pdeathsig() -> None:
    if sys.platform != "linux":
        return  # macOS has no PDEATHSIG: the watchdog thread alone ends the worker
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _watchdog(alive_conn) -> None:
    """Exit as soon as the driver's end of ``alive_conn`` closes (driver died or killed us)."""
    try:
        alive_conn.recv()
    except (EOFError, OSError):
        pass
    os._exit(3)


class _Worker:
    def __init__(
        self, rank, world_size, backend, store_info, conn, outdir, timeout_s, device="cpu", debug=False
    ):
        self.device_type = device
        self.debug = debug
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.store_info = store_info
        self.conn = conn
        self.outdir = outdir
        self.timeout_s = timeout_s
        self.meshes: dict[tuple, Mesh] = {}
        self.targets: dict[str, Any] = {}
        self.impls: dict[str, Any] = {}

    def setup(self) -> None:
        os.environ["OMP_NUM_THREADS"] = os.environ.get("SHARDFUZZ_WORKER_THREADS", "1")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        host, port, prefix = self.store_info
        store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=60))
        store = dist.PrefixStore(prefix, store)
        self.device = select_device(self.backend, self.device_type, self.rank)
        if self.debug:  # collective checking (TORCH_DISTRIBUTED_DEBUG=DETAIL): slow, for replays only
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
            dist.set_debug_level(dist.DebugLevel.DETAIL)
        dist.init_process_group(
            self.backend,
            store=store,
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )

    # -- meshes ---------------------------------------------------------------------------
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
            mine = None
            # every rank must call new_group for every group, in the same order
            for other in itertools.product(
                *[range(s) if i != axis else range(1) for i, s in enumerate(shape)]
            ):
                members = [_ravel((*other[:axis], k, *other[axis + 1 :]), shape) for k in range(shape[axis])]
                if len(members) == n and shape[axis] == n and timeout_s == self.timeout_s:
                    g = dist.group.WORLD
                else:
                    g = dist.new_group(members, timeout=timeout)
                if self.rank in members:
                    mine = (g, tuple(members))
            groups.append(mine[0])
            ranks.append(mine[1])
        m = Mesh(tuple(shape), coords, tuple(groups), tuple(ranks), self.device.type)
        self.meshes[key] = m
        return m

    # -- one example ----------------------------------------------------------------------
    def run(self, task: dict[str, Any]) -> tuple:
        import numpy as np
        import torch
        import torch.distributed as dist

        from shardfuzz.registry import load_ref
        from shardfuzz.target import resolve_worker_target

        case = task["case"]
        tref = task["target"]
        target = self.targets.get(tref)
        if target is None:
            target = self.targets[tref] = resolve_worker_target(tref)
        impl = self.impls.get(task["impl"])
        if impl is None:
            impl = self.impls[task["impl"]] = load_ref(task["impl"], "impl")
        mesh = self.mesh(tuple(case.mesh), task["timeout"])
        group = mesh.groups[-1]
        group_rank = mesh.coords[-1]
        group_size = case.mesh[-1]

        # reset state so a failure replays identically
        torch.use_deterministic_algorithms(bool(task.get("deterministic")))
        torch.manual_seed(case.seed)
        random.seed(case.seed)
        np.random.seed(case.seed % (2**32))
        torch.set_grad_enabled(True)

        inputs = target.inputs(case)
        if self.device.type != "cpu":
            inputs = {k: (v.to(self.device) if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        local = {
            k: (target.input_layout(k).piece(v, group_rank, group_size) if isinstance(v, torch.Tensor) else v)
            for k, v in inputs.items()
        }
        ctx = RankContext(
            case=case,
            rank=self.rank,
            world_size=self.world_size,
            group=group,
            group_rank=group_rank,
            group_size=group_size,
            mesh=mesh,
            inputs=inputs,
            local=local,
            device=self.device,
            world_group=dist.group.WORLD,
        )
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = impl(ctx)
        elapsed = time.perf_counter() - t0
        ignored = [str(w.message) for w in caught if IGNORED_COLLECTIVE_WARNING in str(w.message)]
        for w in caught:
            if IGNORED_COLLECTIVE_WARNING not in str(w.message):
                warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        if not isinstance(out, dict):
            raise TypeError(
                f"implementation {task['impl']!r} returned {type(out).__name__}, expected a dict of outputs"
            )
        info = {"elapsed": elapsed, "ignored_collective": ignored}
        if task.get("want_flags"):
            info["numerics"] = numerics_flags()
        return ("ok", encode(out), info)

    def serve(self) -> None:
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)
            if msg[0] == "stop":
                break
            if msg[0] == "run":
                try:
                    reply = self.run(msg[1])
                except Unsupported as e:
                    reply = ("unsupported", str(e))
                except BaseException as e:  # report everything, including SystemExit from user code
                    tb = traceback.format_exc()
                    last = tb.strip().splitlines()[-1] if tb.strip() else ""
                    reply = (
                        "error",
                        tb,
                        type(e).__name__,
                        any(m in last for m in TIMEOUT_MARKERS),
                        any(m in last for m in PEER_MARKERS),
                    )
                    sys.stderr.flush()
                try:
                    self.conn.send(reply)
                except Exception as e:  # an output that does not pickle
                    self.conn.send(
                        ("error", f"could not send outputs back: {e!r}", type(e).__name__, False, False)
                    )
        import torch.distributed as dist

        try:
            dist.destroy_process_group()
        except Exception:
            pass


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


def worker_main(
    rank, world_size, backend, store_info, conn, alive_conn, outdir, timeout_s, device="cpu", debug=False
) -> None:
    """Entry point of a worker process."""
    _set_pdeathsig()
    if os.getppid() == 1:  # the forkserver (our parent) died before PDEATHSIG was armed
        os._exit(3)
    threading.Thread(target=_watchdog, args=(alive_conn,), daemon=True).start()
    # capture this rank's stdout/stderr in files the driver attaches to reports
    for fd, name in ((1, "out"), (2, "err")):
        f = os.open(os.path.join(outdir, f"rank{rank}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    stack_file = open(os.path.join(outdir, f"rank{rank}.stack"), "w")
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True, chain=False)
    w = _Worker(rank, world_size, backend, store_info, conn, outdir, timeout_s, device, debug)
    try:
        w.setup()
    except BaseException:
        conn.send(("error", traceback.format_exc(), "setup", False, False))
        os._exit(1)
    conn.send(("ready", os.getpid()))
    w.serve()
    os._exit(0)
