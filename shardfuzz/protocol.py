"""The typed messages between the driver and the ranks, and the tensor codec they carry.

The driver sends a :class:`Task` per example; each rank answers with exactly one of
:class:`Reply` (its outputs), :class:`UnsupportedReply` (the implementation refused the case) or
:class:`ErrorReply` (an exception). At start-up a rank says :class:`Ready` or :class:`StartFailed`;
after a rank error the driver may send :class:`Regroup` to keep the processes (:mod:`shardfuzz.ranks.regroup`).
The pool turns the answers of all ranks into one :class:`Outcome`: :class:`Completed`,
:class:`RankFailed`, :class:`RankDied` or :class:`Hung`. The same messages travel under torchrun
(:mod:`shardfuzz.repro.torchrun`), gathered through a separate CPU group.

Every message pickles (multiprocessing pipes, ``gather_object``); tensors travel encoded as
numpy arrays with their torch dtype tag, bf16 as its int16 bits.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from shardfuzz.case import Case

# torch is imported inside the functions that use it: the CLI's parser or the pytest
# plugin loads this module at start (START_UP in tests/test_structure.py)

POINT_TO_POINT = ("send", "recv")


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective a rank entered.

    ``seq``: its place in this rank's trace of the example (from 0); ``op``: the canonical name
    (:data:`CANONICAL`; ``api`` says which API was called, ``call`` the function); ``group``: the
    group's global ranks (``()`` if unknown); ``shapes``/``dtype``: this rank's contribution;
    ``out_shapes``: the outputs, where the op takes them (an all-gather's list); ``splits``: for
    an all-to-all, the numel sent to and received from each group rank; ``peer``: the global rank
    of a send's destination, a recv's source, or a rooted op's root; ``strides``: empty when every
    tensor was contiguous, else one entry per tensor of ``shapes`` then ``out_shapes``, its strides
    where it was not contiguous and None where it was (gloo's c10d collectives use a
    non-contiguous tensor's raw memory: :func:`shardfuzz.report.divergence.describe_layouts`);
    ``tag``: a point-to-point operation's tag (a send matches only a receive of its own tag).
    """

    seq: int
    op: str
    group: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...] = ()
    dtype: str = ""
    out_shapes: tuple[tuple[int, ...], ...] = ()
    splits: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    peer: int | None = None
    api: str = "c10d"
    call: str = ""
    strides: tuple[tuple[int, ...] | None, ...] = ()
    tag: int | None = None

    def signature(self) -> str:
        """``all_reduce(float32[4, 2])``: the op and what this rank contributed."""
        shapes = ", ".join(
            f"{self.dtype}[{', '.join(map(str, s))}]" for s in (self.shapes or self.out_shapes)
        )
        return f"{self.op}({shapes})"

    def to_json(self) -> str:
        return json.dumps(
            [self.seq, self.op, self.group, self.shapes, self.dtype, self.out_shapes, self.splits, self.peer,
             self.api, self.call, self.strides, self.tag],
            separators=(",", ":"),
        )  # fmt: skip

    @classmethod
    def from_json(cls, line: str) -> Collective:
        seq, op, group, shapes, dtype, outs, splits, peer, api, call, *rest = json.loads(line)
        strides = tuple(None if s is None else tuple(s) for s in rest[0]) if rest else ()
        tag = rest[1] if len(rest) > 1 else None
        return cls(
            seq, op, tuple(group), tuple(map(tuple, shapes)), dtype, tuple(map(tuple, outs)),
            None if splits is None else (tuple(splits[0]), tuple(splits[1])), peer, api, call, strides, tag,
        )  # fmt: skip


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
    timeout: float  # the gloo timeout of the case's groups: the hard cap, so the driver decides hangs
    deterministic: bool = False
    want_flags: bool = False  # report the numerics flags (first example only)
    trace: bool = True  # record the collectives the implementation enters (shardfuzz.ranks.trace)


@dataclasses.dataclass(frozen=True)
class Reply:
    """A rank's outputs for one task (encoded) and what it noticed while running it.

    ``leaks``: global state the example changed and did not restore (the rank restored what it
    could), e.g. ``"rank 1 left torch.get_default_dtype() = torch.float64"``; ``restart``: some of
    it cannot be undone (process groups, threads, file descriptors), so the pool must restart.
    """

    outputs: dict[str, Any]
    elapsed: float
    ignored_collectives: tuple[str, ...] = ()
    numerics: dict[str, Any] | None = None
    leaks: tuple[str, ...] = ()
    restart: bool = False
    trace: tuple[Collective, ...] = ()  # the collectives this rank entered, in order


@dataclasses.dataclass(frozen=True)
class UnsupportedReply:
    """The implementation raised :class:`~shardfuzz.Unsupported` on this rank (``leaks`` and
    ``restart`` as in :class:`Reply`)."""

    reason: str
    leaks: tuple[str, ...] = ()
    restart: bool = False
    message: str = ""  # the exception's message, where it says more than the reason counted


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


@dataclasses.dataclass(frozen=True)
class Warm:
    """Import a target and an implementation ahead of the next task (a spare pool); no answer."""

    target_ref: str
    impl_ref: str


@dataclasses.dataclass(frozen=True)
class Regroup:
    """After a rank error: tear down this rank's process groups (which fails the collectives its
    peers are blocked in), drop every group cached from them, and join a fresh world group under
    store prefix ``generation``. A rank still running the task answers it first; then each rank
    answers :class:`Regrouped`, or :class:`ErrorReply` (the pool is discarded). ``answered``:
    every rank had answered the task, so no rank is blocked in a collective of the old groups."""

    generation: int
    answered: bool = False


@dataclasses.dataclass(frozen=True)
class Regrouped:
    generation: int


RankAnswer = Reply | UnsupportedReply | ErrorReply


# -- what the pool makes of the answers ------------------------------------------------------------
# -- rank servers that torchrun starts (shardfuzz.ranks.serve, shardfuzz.ranks.remote) ----------
#: which ranks of a torchrun world run a case of w ranks (recorded in failure files): its first w
RANK_RULE = "first"


@dataclasses.dataclass(frozen=True)
class Hello:
    """A rank server's first message on each of its two channels, once the secret is proved:
    ``channel`` is ``"task"`` (tasks and answers, as a local rank's pipe) or ``"control"`` (the
    driver's questions about the process: CPU time, output, stacks)."""

    channel: str
    rank: int
    world_size: int
    local_rank: int
    host: str
    pid: int


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """What the driver tells every rank server before it joins the torchrun world's group."""

    backend: str
    device: str
    timeout_s: float
    debug: bool = False


@dataclasses.dataclass(frozen=True)
class MakeMesh:
    """Every rank server makes the groups of ``shape`` over the first ``world_size`` ranks (new_group
    is collective over the whole torchrun world), cached like a local rank's meshes; the ranks
    outside them only take part. Answered by :class:`MeshMade` or :class:`ErrorReply`."""

    world_size: int
    shape: tuple[int, ...]
    timeout_s: float


@dataclasses.dataclass(frozen=True)
class MeshMade:
    world_size: int
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Control:
    """A question on the control channel: ``what`` is ``cpu``, ``runnable``, ``size``, ``tail``,
    ``stack``, ``trace`` or ``exit`` (``name``: the file, ``offset``: where to read from)."""

    what: str
    name: str = ""
    offset: int = 0
    seq: int = 0  # answered as (seq, value): a late answer to an earlier question is told apart


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
    traces: dict[int, tuple[Collective, ...]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class RankDied:
    """A rank process exited in the middle of an example: ``rank``, the lowest of those that did
    (``dead``: every one the driver saw exit, with its exit code)."""

    rank: int
    exitcode: int | None
    output: dict[int, str] = dataclasses.field(default_factory=dict)
    elapsed: float = 0.0
    traces: dict[int, tuple[Collective, ...]] = dataclasses.field(default_factory=dict)
    dead: dict[int, int | None] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Hung:
    """The example did not finish, with the evidence. ``evidence``: ``"idle"`` (no rank used CPU
    for ``window`` s: stuck), ``"cap"`` (ranks ``busy`` still used CPU at the hard cap ``cap``),
    ``"timeout"`` (no CPU times on this system: a plain timeout after ``window`` s) or ``"grace"``
    (ranks still out after a peer's collective failed). ``finished``: ranks that answered;
    ``stuck``: ranks that did not; ``cpu``: CPU seconds each rank used in the example;
    ``timed_out``: collectives that timed out inside ranks (at the cap); ``stacks``: every rank's
    stack; ``traces``: the collectives each rank entered (every failed outcome has them)."""

    rank: int
    timed_out: dict[int, str] = dataclasses.field(default_factory=dict)
    stacks: dict[int, str] = dataclasses.field(default_factory=dict)
    output: dict[int, str] = dataclasses.field(default_factory=dict)
    elapsed: float = 0.0
    evidence: str = "timeout"
    window: float = 0.0
    cap: float = 0.0
    finished: tuple[int, ...] = ()
    stuck: tuple[int, ...] = ()
    busy: tuple[int, ...] = ()
    cpu: dict[int, float] = dataclasses.field(default_factory=dict)
    traces: dict[int, tuple[Collective, ...]] = dataclasses.field(default_factory=dict)


Outcome = Completed | RankFailed | RankDied | Hung


# -- what ranks report besides their outputs -------------------------------------------------------
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


# -- the tensor codec ------------------------------------------------------------------------------
_TENSOR_TAG = "__tensor__"


def dense(t: Any) -> Any:
    """``t``, with autograd's lazy zeros (a ZeroTensor: the gradient of ``sgn``) made real zeros:
    what reads values (numpy, a reproducer's literal) finds no storage in them."""
    import torch

    return torch.zeros(t.shape, dtype=t.dtype, device=t.device) if t._is_zerotensor() else t


def encode(value: Any) -> Any:
    """Tensors become numpy arrays tagged with their torch dtype; bf16 travels as int16 bits."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = dense(t)
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
