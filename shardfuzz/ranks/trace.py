"""The collective trace of a rank: every collective it enters, in order, as cheap metadata.

:func:`install` wraps, once per rank process, the collectives of ``torch.distributed`` (the c10d
API: ``all_reduce``, ``all_gather_into_tensor``, ``all_to_all_single``, ``send``/``irecv``, and
``batch_isend_irecv``'s operations one by one) and of
``torch.distributed._functional_collectives`` (what DTensor and torch's context parallelism
call). A wrapper records a :class:`Collective`, the op's name, its group as global ranks, shapes,
dtype, the strides of any non-contiguous tensor, all-to-all split sizes and point-to-point peer, and
then calls the real function: no tensor is copied or read. A collective that another wrapped one
calls (``all_gather_object`` gathers through ``all_gather``) is recorded once, as the outer one.

Each event is kept in memory (the rank's reply carries the example's trace) and written as one line
to the rank's trace file as it is entered, so that the driver can still read it after a hang, an
abort or a dead rank (:func:`read_trace`).

Not seen: collectives that C++ issues by itself (the backward of the functional collectives'
autograd variants), and functions a module outside ``torch.distributed`` bound by name before
:func:`install` ran (the worker installs before it imports any target or implementation; the
modules of ``torch.distributed`` already imported get the traced functions).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

# the record a rank keeps of each collective is a message type of the core protocol
from shardfuzz.protocol import POINT_TO_POINT as POINT_TO_POINT
from shardfuzz.protocol import Collective as Collective

# torch.distributed is imported inside the functions that use it: the CLI's parser or the pytest
# plugin loads this module at start (START_UP in tests/test_structure.py)

#: c10d API: name -> (tensor arguments that are this rank's contribution, those that are outputs)
C10D_OPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "all_reduce": (("tensor",), ()),
    "all_reduce_coalesced": (("tensors",), ()),
    "broadcast": (("tensor",), ()),
    "reduce": (("tensor",), ()),
    "all_gather": (("tensor",), ("tensor_list",)),
    "all_gather_into_tensor": (("input_tensor",), ("output_tensor",)),
    # torch 2.13's names, which the two above and FSDP2 call (nested calls are recorded once)
    "all_gather_single": (("input_tensor",), ("output_tensor",)),
    "_all_gather_base": (("input_tensor",), ("output_tensor",)),
    "gather": (("tensor",), ("gather_list",)),
    "scatter": (("scatter_list",), ("tensor",)),
    "reduce_scatter": (("input_list",), ("output",)),
    "reduce_scatter_tensor": (("input",), ("output",)),
    "reduce_scatter_single": (("input",), ("output",)),
    "_reduce_scatter_base": (("input",), ("output",)),
    "all_to_all": (("input_tensor_list",), ("output_tensor_list",)),
    "all_to_all_single": (("input",), ("output",)),
    "barrier": ((), ()),
    "monitored_barrier": ((), ()),
    "send": (("tensor",), ()),
    "isend": (("tensor",), ()),
    "recv": ((), ("tensor",)),
    "irecv": ((), ("tensor",)),
    "all_gather_object": ((), ()),
    "broadcast_object_list": ((), ()),
    "gather_object": ((), ()),
    "scatter_object_list": ((), ()),
}
#: functional collectives (``self`` is the input); the output's shape follows from the group size
FUNCTIONAL_OPS = (
    "broadcast all_reduce all_gather_single all_gather_single_autograd reduce_scatter_single "
    "reduce_scatter_single_autograd all_gather_tensor all_gather_tensor_autograd reduce_scatter_tensor "
    "reduce_scatter_tensor_autograd all_reduce_coalesced all_gather_single_coalesced "
    "reduce_scatter_single_coalesced all_gather_into_tensor_coalesced reduce_scatter_tensor_coalesced "
    "all_to_all_single all_to_all_single_autograd permute_tensor"
).split()
#: the name an op is reported and accounted under (variants of one collective share it)
CANONICAL = {
    "_all_gather_base": "all_gather_into_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "all_gather_single": "all_gather_into_tensor",
    "all_gather_tensor": "all_gather_into_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "all_gather_single_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced",
    "send": "send",
    "isend": "send",
    "recv": "recv",
    "irecv": "recv",
}


# -- the tracer in a rank -------------------------------------------------------------------------
class Tracer:
    """This rank's trace: on while an example runs (:meth:`start` / :meth:`stop`)."""

    def __init__(self) -> None:
        self.events: list[Collective] = []
        self.on = False
        self.fd: int | None = None
        self._local = threading.local()
        self._groups: dict[int, tuple[Any, tuple[int, ...]]] = {}

    def start(self, enabled: bool = True) -> None:
        """A new example: an empty trace (the file too: it holds one example, read from 0)."""
        self.events, self.on = [], enabled
        if self.fd is not None:
            try:
                os.ftruncate(self.fd, 0)
            except OSError:
                pass

    def stop(self) -> tuple[Collective, ...]:
        self.on = False
        return tuple(self.events)

    def record(self, make: Callable[[int], Collective | None]) -> None:
        try:
            event = make(len(self.events))
        except Exception:  # noqa: BLE001 (whatever describing it raises, the trace must never break the collective it describes, in user code)
            return
        if event is None:
            return
        self.events.append(event)
        if self.fd is not None:
            try:
                os.write(self.fd, (event.to_json() + "\n").encode())
            except OSError:
                pass

    def group_ranks(self, group: Any) -> tuple[int, ...]:
        import torch.distributed as dist

        group = group if group is not None else dist.group.WORLD
        hit = self._groups.get(id(group))
        if hit is not None and hit[0]() is group:
            return hit[1]
        ranks = tuple(dist.get_process_group_ranks(group))
        self._groups[id(group)] = (weakref.ref(group), ranks)
        return ranks

    def functional_group(self, group: Any, tag: str = "") -> tuple[int, ...]:
        if isinstance(group, (list, tuple)) and all(isinstance(r, int) for r in group):
            return tuple(group)
        import torch.distributed._functional_collectives as funcol
        import torch.distributed.distributed_c10d as c10d

        return self.group_ranks(c10d._resolve_process_group(funcol._resolve_group_name(group, tag)))


TRACER = Tracer()
_installed = False


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if isinstance(t, torch.Tensor)]
    return []


def _dtype(tensors: list[Any]) -> str:
    return str(tensors[0].dtype).removeprefix("torch.") if tensors else ""


def _shapes(tensors: list[Any]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(t.shape) for t in tensors)


def _strides(tensors: list[Any]) -> tuple[tuple[int, ...] | None, ...]:
    """``Collective.strides``: () when every tensor is contiguous (the common case: one check each)."""
    if all(t.is_contiguous() for t in tensors):
        return ()
    return tuple(None if t.is_contiguous() else tuple(t.stride()) for t in tensors)


def _c10d_event(name: str, sig: inspect.Signature, args: tuple, kwargs: dict, seq: int) -> Collective:
    import torch.distributed as dist

    b = sig.bind_partial(*args, **kwargs).arguments
    ins, outs = C10D_OPS[name]
    tin = [t for a in ins for t in _tensors(b.get(a))]
    tout = [t for a in outs for t in _tensors(b.get(a))]
    group = b.get("group")
    ranks = TRACER.group_ranks(group)
    peer = None
    for key, gkey in (("dst", "group_dst"), ("src", "group_src")):
        if b.get(key) is not None:
            peer = int(b[key])
        elif b.get(gkey) is not None:
            peer = dist.get_global_rank(group if group is not None else dist.group.WORLD, b[gkey])  # type: ignore[arg-type]
    splits = None
    if name == "all_to_all_single":
        n, t_in, t_out = len(ranks), tin[0], tout[0]
        row_in = t_in.numel() // max(t_in.shape[0], 1) if t_in.dim() else 1
        row_out = t_out.numel() // max(t_out.shape[0], 1) if t_out.dim() else 1
        sin = b.get("input_split_sizes") or [t_in.shape[0] // n] * n if t_in.dim() else [0] * n
        sout = b.get("output_split_sizes") or [t_out.shape[0] // n] * n if t_out.dim() else [0] * n
        splits = (tuple(int(s) * row_in for s in sin), tuple(int(s) * row_out for s in sout))
    elif name == "all_to_all":
        splits = (tuple(t.numel() for t in tin), tuple(t.numel() for t in tout))
    # a point-to-point op's tag (0 unless given): a send matches only a receive of its own tag
    tag = int(b.get("tag") or 0) if "tag" in sig.parameters else None
    return Collective(
        seq, CANONICAL.get(name, name), ranks, _shapes(tin), _dtype(tin or tout), _shapes(tout), splits, peer,
        "c10d", name, _strides(tin + tout), tag,
    )  # fmt: skip


def _functional_event(name: str, sig: inspect.Signature, args: tuple, kwargs: dict, seq: int) -> Collective:
    b = sig.bind_partial(*args, **kwargs).arguments
    first = next(iter(b.values()))  # ``self`` or ``inputs``: the input tensor(s)
    tin = _tensors(first)
    ranks = TRACER.functional_group(b.get("group"), b.get("tag", "") or "")
    splits, peer = None, None
    if name.startswith("all_to_all_single"):
        n, t = len(ranks), tin[0]
        row = t.numel() // max(t.shape[0], 1) if t.dim() else 1
        sin = b.get("input_split_sizes") or [t.shape[0] // n] * n
        sout = b.get("output_split_sizes") or [t.shape[0] // n] * n
        splits = (tuple(int(s) * row for s in sin), tuple(int(s) * row for s in sout))
    if name == "broadcast":
        peer = ranks[b["src"]] if ranks and 0 <= b.get("src", -1) < len(ranks) else b.get("src")
    op = CANONICAL.get(name.removesuffix("_autograd"), name.removesuffix("_autograd"))
    if name == "permute_tensor":
        op = "all_to_all_single"
    return Collective(
        seq, op, ranks, _shapes(tin), _dtype(tin), (), splits, peer, "functional", name, _strides(tin)
    )


def _wrap(fn: Callable[..., Any], make: Callable[..., Collective]) -> Callable[..., Any]:
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        local = TRACER._local
        depth = getattr(local, "depth", 0)
        if TRACER.on and depth == 0:
            TRACER.record(lambda seq: make(sig, args, kwargs, seq))
        local.depth = depth + 1
        try:
            return fn(*args, **kwargs)
        finally:
            local.depth = depth

    traced.__shardfuzz_traced__ = fn  # type: ignore[attr-defined]
    return traced


def install(trace_path: str | None = None) -> Tracer:
    """Wrap the collectives (once per process) and open this rank's trace file."""
    global _installed
    if trace_path is not None and TRACER.fd is None:
        TRACER.fd = os.open(trace_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if _installed:
        return TRACER
    _installed = True
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.distributed_c10d as c10d

    wrapped: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}
    for name in C10D_OPS:
        original = getattr(c10d, name, None)
        if original is None or hasattr(original, "__shardfuzz_traced__"):
            continue
        traced = _wrap(original, functools.partial(_c10d_event, name))
        wrapped[id(original)] = (original, traced)
        for module in (c10d, dist):
            if getattr(module, name, None) is original:
                setattr(module, name, traced)
    _rebind(wrapped)
    for name in FUNCTIONAL_OPS:
        original = getattr(funcol, name, None)
        if original is not None and not hasattr(original, "__shardfuzz_traced__"):
            setattr(funcol, name, _wrap(original, functools.partial(_functional_event, name)))
    _adopt_p2p_ops(c10d)
    return TRACER


def _rebind(wrapped: dict[int, tuple[Callable[..., Any], Callable[..., Any]]]) -> None:
    """Give the traced collectives to the modules of ``torch.distributed`` already imported that
    bound the originals by name: DTensor's ``distribute_tensor`` broadcasts and scatters through
    ``from distributed_c10d import broadcast, scatter``. Unseen, a rank blocked in one looked as if
    it had entered no collective yet, and every rank error beside it waited a second for it."""
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("torch.distributed."):
            continue
        for attr, value in list(vars(module).items()):
            pair = wrapped.get(id(value))
            if pair is not None and pair[0] is value:
                setattr(module, attr, pair[1])


def _adopt_p2p_ops(c10d: Any) -> None:
    """``batch_isend_irecv`` tells sends from receives by ``op.op is isend``: a P2POp made with the
    functions as they were before :func:`install` gets the traced ones."""
    originals = {c10d.isend.__shardfuzz_traced__: c10d.isend, c10d.irecv.__shardfuzz_traced__: c10d.irecv}
    batch = c10d.batch_isend_irecv

    @functools.wraps(batch)
    def batch_isend_irecv(p2p_op_list: list[Any]) -> Any:
        for op in p2p_op_list:
            if op.op in originals:
                op.op = originals[op.op]
        return batch(p2p_op_list)

    c10d.batch_isend_irecv = batch_isend_irecv
    import torch.distributed as dist

    dist.batch_isend_irecv = batch_isend_irecv


def read_trace(path: str) -> tuple[Collective, ...]:
    """The events a rank's trace file holds (its current example; a torn last line is dropped)."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return ()
    events = []
    for line in lines:
        try:
            events.append(Collective.from_json(line))
        except (ValueError, TypeError):
            continue
    return tuple(events)
