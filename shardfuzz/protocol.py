"""The typed messages between the driver and the ranks, and the tensor codec they carry.

The driver sends a :class:`Task` per example; each rank answers with exactly one of
:class:`Reply` (its outputs), :class:`UnsupportedReply` (the implementation refused the case) or
:class:`ErrorReply` (an exception). At start-up a rank says :class:`Ready` or :class:`StartFailed`.
The pool turns the answers of all ranks into one :class:`Outcome`: :class:`Completed`,
:class:`RankFailed`, :class:`RankDied` or :class:`Hung`. The same messages travel under torchrun
(:mod:`shardfuzz.torchrun`), gathered through a separate CPU group.

Every message pickles (multiprocessing pipes, ``gather_object``); tensors travel encoded as
numpy arrays with their torch dtype tag, bf16 as its int16 bits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shardfuzz.case import Case


@dataclasses.dataclass(frozen=True)
class ImplRef:
    """An implementation as workers import it: ``pkg.mod:func`` or ``file.py::NAME``, plus the
    keyword arguments it is bound with (``bug="..."`` for a planted bug of a reference)."""

    ref: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        if not self.kwargs:
            return self.ref
        return f"{self.ref}({', '.join(f'{k}={v!r}' for k, v in self.kwargs)})"

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "kwargs": dict(self.kwargs)}

    @classmethod
    def from_parts(cls, ref: str, kwargs: dict[str, Any] | None = None) -> ImplRef:
        return cls(ref, tuple(sorted((kwargs or {}).items())))


@dataclasses.dataclass(frozen=True)
class Task:
    """One example for every rank of a pool."""

    case: Case
    target_ref: str  # where the rank imports the target from (Target.worker_ref)
    impl: ImplRef
    timeout: float  # the gloo timeout of the groups the case's mesh uses
    deterministic: bool = False
    want_flags: bool = False  # report the numerics flags (first example only)


@dataclasses.dataclass(frozen=True)
class Reply:
    """A rank's outputs for one task (encoded) and what it noticed while running it."""

    outputs: dict[str, Any]
    elapsed: float
    ignored_collectives: tuple[str, ...] = ()
    numerics: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class UnsupportedReply:
    """The implementation raised :class:`~shardfuzz.Unsupported` on this rank."""

    reason: str


@dataclasses.dataclass(frozen=True)
class ErrorReply:
    """An exception on a rank. ``timed_out``: a collective timed out; ``peer_closed``: a collective
    failed because a peer went away (a consequence, not the cause)."""

    traceback: str
    exc_type: str
    timed_out: bool = False
    peer_closed: bool = False


@dataclasses.dataclass(frozen=True)
class Ready:
    pid: int


@dataclasses.dataclass(frozen=True)
class StartFailed:
    traceback: str


@dataclasses.dataclass(frozen=True)
class Stop:
    pass


RankAnswer = Reply | UnsupportedReply | ErrorReply


# -- what the pool makes of the answers ------------------------------------------------------------
@dataclasses.dataclass
class Completed:
    """Every rank answered with a :class:`Reply` or an :class:`UnsupportedReply`."""

    replies: list[Reply | UnsupportedReply]
    elapsed: float = 0.0


@dataclasses.dataclass
class RankFailed:
    """A rank raised; ``rank`` is the cause (not a peer that saw the connection close)."""

    rank: int
    error: ErrorReply
    output: dict[int, str] = dataclasses.field(default_factory=dict)
    elapsed: float = 0.0


@dataclasses.dataclass
class RankDied:
    """A rank process exited in the middle of an example."""

    rank: int
    exitcode: int | None
    output: dict[int, str] = dataclasses.field(default_factory=dict)
    elapsed: float = 0.0


@dataclasses.dataclass
class Hung:
    """No result in time, or collectives timed out inside ranks. ``stacks``: every rank's stack."""

    rank: int
    timed_out: dict[int, str] = dataclasses.field(default_factory=dict)
    stacks: dict[int, str] = dataclasses.field(default_factory=dict)
    output: dict[int, str] = dataclasses.field(default_factory=dict)
    elapsed: float = 0.0


Outcome = Completed | RankFailed | RankDied | Hung


# -- the tensor codec ------------------------------------------------------------------------------
_TENSOR_TAG = "__tensor__"


def encode(value: Any) -> Any:
    """Tensors become numpy arrays tagged with their torch dtype; bf16 travels as int16 bits."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        dtype = str(t.dtype).removeprefix("torch.")
        arr = (
            t.contiguous().view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.contiguous().numpy()
        )
        return (_TENSOR_TAG, dtype, arr)
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(encode(v) for v in value)
    return value


def decode(value: Any) -> Any:
    import torch

    if isinstance(value, tuple) and len(value) == 3 and value[0] == _TENSOR_TAG:
        _, dtype, arr = value
        t = torch.from_numpy(arr.copy())
        return t.view(torch.bfloat16) if dtype == "bfloat16" else t
    if isinstance(value, dict):
        return {k: decode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(decode(v) for v in value)
    return value
