"""Finding signatures by cause: what tells two findings apart, and what makes them one.

A finding's signature is its kind and its site (:attr:`shardfuzz.errors.Finding.site`). For an
exception on a rank (kind ``rank-error``) the site is read from the traceback by cause, not by the
innermost frame: every backward failure raises from the same autograd frame, every failed
collective from ``distributed_c10d.py``, so the innermost frame merges different bugs. The site is

* the exception type,
* the *cause frame*: the deepest frame that belongs to the op or to user code, past the framework
  frames (:data:`FRAMEWORK`: torch's autograd, dispatch and collectives, shardfuzz's own engine,
  Python's standard library); for an exception raised ``from`` another (DTensor's "sharding
  propagation failed"), the deepest such frame of the root cause. Named ``path in function``
  without the line number, so the same bug keys alike across versions of the code around it;
* the first line of the message, normalised (:func:`normalise_message`): sizes, shapes, dtypes,
  placements, op names, numbers and addresses become placeholders, so one bug whose message
  varies with the case is one finding.

Signatures are versioned (:data:`SIGNATURE_VERSION`): a stored finding (a failure file, a shared
store) keyed under an older version is re-keyed on read from its stored report when it can be
(:func:`stored_signature`), and otherwise shown as such, never compared as if current.

Version history: 1, kind and innermost raising frame with its line (``Finding.signature`` before
issue 31); 2, this module.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sysconfig
from collections.abc import Mapping, Sequence
from typing import Any

#: the version of :func:`finding_signature`; bump it whenever a signature of one finding changes
SIGNATURE_VERSION = 2

#: path fragments of framework frames (``/`` separated): the machinery that calls the op or user
#: code; the frame under it that raised is never the cause
FRAMEWORK = (
    "/torch/autograd/",
    "/torch/_tensor.py",
    "/torch/_ops.py",
    "/torch/overrides.py",
    "/torch/_compile.py",
    "/torch/_dynamo/",
    "/torch/utils/_python_dispatch.py",
    "/torch/_subclasses/",
    "/torch/nn/modules/module.py",
    "/torch/distributed/tensor/_dispatch.py",
    "/torch/distributed/tensor/_sharding_prop.py",
    "/torch/distributed/tensor/_api.py",
    "/torch/distributed/tensor/_op_schema.py",
    "/torch/distributed/distributed_c10d.py",
    "/torch/distributed/c10d_logger.py",
    "/torch/distributed/_functional_collectives",
    "/torch/distributed/nn/functional.py",
)


def _own_paths() -> tuple[str, ...]:
    """shardfuzz's own modules and subpackages as path fragments (``/shardfuzz/engine/``,
    ``/shardfuzz/signature.py``, ...): the same in every install of a version, so a traceback from
    another machine keys alike; a user's folder that happens to be named ``shardfuzz`` (where ``git
    clone`` puts the repository) is not shardfuzz's code, nor are the targets it ships."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = (n for n in os.listdir(here) if n != "__pycache__" and not n.startswith("."))
    return tuple(
        f"/shardfuzz/{n}/" if os.path.isdir(os.path.join(here, n)) else f"/shardfuzz/{n}"
        for n in sorted(names)
        if os.path.isdir(os.path.join(here, n)) or n.endswith(".py")
    )


_OWN = _own_paths()

_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)', re.M)
_BLOCK = "Traceback (most recent call last):"
_CAUSE = "The above exception was the direct cause of the following exception:"


def _stdlib_dirs() -> tuple[str, ...]:
    return tuple(
        p.rstrip("/") + "/" for p in {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")} if p
    )


_STDLIB = _stdlib_dirs()


def is_framework(path: str) -> bool:
    """Whether a frame's file is framework machinery (see :data:`FRAMEWORK`), not op or user code."""
    p = path.replace("\\", "/")
    if "/site-packages/" not in p and p.startswith(_STDLIB):
        return True
    return any(part in p for part in FRAMEWORK) or any(part in p for part in _OWN)


def short_path(path: str) -> str:
    """A frame's file without the machine's prefix: from the package (``torch/...``) or the basename."""
    p = path.replace("\\", "/")
    if "/torch/" in p:
        return "torch/" + p.rsplit("/torch/", 1)[1]
    own = next((part for part in _OWN if part in p), None)
    if own is not None:
        return "shardfuzz/" + own[len("/shardfuzz/") :] + p.rsplit(own, 1)[1]
    return p.rsplit("/", 1)[-1]


# message normalisation: the order matters (spec text and dtypes before numbers)
_NORMALISE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), repl)
    for pattern, repl in (
        (r"0x[0-9a-fA-F]+", "<addr>"),
        (r"(?:/[\w.+-]+)+/([\w.+-]+)", r"\1"),  # absolute paths: their basename
        (r"\b(?:torch\.ops\.)?aten\.\w+(?:\.\w+)?", "<op>"),
        (r"\btorch\.(?:float|bfloat|half|double|int|uint|long|short|bool|complex|cfloat)\w*", "<dtype>"),
        (r"\b(?:float|bfloat|int|uint|complex)(?:8|16|32|64|128)\b|\b(?:half|double)\b", "<dtype>"),
        (r"\b(?:bf16|f16|f32|f64|c64|c128|i8|i16|i32|i64|u8|b8)(?=\[)", "<dtype>"),
        (r"\b(?:_StridedShard|Shard|Replicate|Partial|S|R|P)\([^()]*\)", "<placement>"),
        (r"\bR\b", "<placement>"),
        (r"<placement>(?:\s*,?\s*<placement>)*,?", "<placement>"),  # 1-D and 2-D meshes alike
        (r"torch\.Size\(\[[^\]]*\]\)", "<shape>"),
        (r"\[[\d\s,]*\]", "<shape>"),
        (r"\((?:\s*\d+\s*,)+\s*\d*\s*\)", "<shape>"),
        (r"(?<![\w.])[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?", "N"),
        (r"\s+", " "),
    )
)
#: normalised messages are cut here (a message may quote a whole tensor)
MAX_MESSAGE = 240


def normalise_message(message: str) -> str:
    """``message`` with sizes, shapes, dtypes, placements, op names, numbers, addresses and
    absolute paths replaced by placeholders (``N``, ``<shape>``, ``<dtype>``...)."""
    text = message.strip()
    for pattern, repl in _NORMALISE:
        text = pattern.sub(repl, text)
    return text.strip()[:MAX_MESSAGE]


@dataclasses.dataclass(frozen=True)
class Cause:
    """Where an exception comes from, read from its traceback text."""

    exc_type: str
    frame: str  # ``torch/distributed/tensor/_ops/_view_ops.py in view_groups``; "" without frames
    message: str  # the first line, normalised

    def site(self) -> tuple[str, str, str]:
        return (self.exc_type, self.frame, self.message)


def _cause_frame(frames: Sequence[tuple[str, str, str]]) -> str:
    """The deepest frame that is not framework machinery (else the innermost one)."""
    for path, _line, func in reversed(frames):
        if not is_framework(path):
            return f"{short_path(path)} in {func}"
    return f"{short_path(frames[-1][0])} in {frames[-1][2]}" if frames else ""


def _exception_line(block: str) -> str:
    """The first line of the exception a traceback block ends with (after its last frame)."""
    lines = block.splitlines()
    last = max((i for i, ln in enumerate(lines) if _FRAME.match(ln)), default=-1)
    for ln in lines[last + 1 :]:
        if ln.strip() and not ln.startswith((" ", "\t")):
            return ln.strip()
    return ""


#: torch's own sharded code, above its collectives: DTensor and its parallel plans, FSDP2, pipelining
TORCH_SHARDED_CODE = (
    "torch/distributed/tensor/",
    "torch/distributed/_tensor/",
    "torch/distributed/fsdp/",
    "torch/distributed/_composable/",
    "torch/distributed/pipelining/",
)


def raised_in_torch(traceback_text: str) -> str | None:
    """Where the last exception of a formatted traceback was raised when that is torch's own
    sharded code (``torch/distributed/tensor/_sharding_prop.py in propagate``), else None: not a
    collective's own error (a wrong size handed to it), nor autograd's engine re-raising what a
    backward raised. The innermost frames that are torch's are read, not the last one alone: an op
    that DTensor's dispatch ran on a local shard raises in ``torch/_ops.py`` (a new user's
    ``RowwiseParallel`` embedding on a rank with no vocabulary rows got no note); the deepest frame
    of torch's sharded code among them is named."""
    block = traceback_text.split(_BLOCK)[-1].split(_CAUSE)[0]
    innermost = []
    for path, _line, func in reversed(_FRAME.findall(block)):
        where = short_path(path)
        if not where.startswith("torch/"):
            break
        innermost.append(f"{where} in {func}")
    return next((w for w in innermost if w.startswith(TORCH_SHARDED_CODE)), None)


def cause_of(traceback_text: str) -> Cause:
    """The :class:`Cause` of the last exception in a formatted traceback (``traceback.format_exc()``
    text, chained exceptions included; text after the exception line is ignored)."""
    blocks = [b.split(_CAUSE)[0] for b in traceback_text.split(_BLOCK)]
    chained = [_CAUSE in b for b in traceback_text.split(_BLOCK)]  # block i caused block i + 1
    last = len(blocks) - 1
    root = last  # walk back through "raise ... from" to the root cause
    while root > 0 and chained[root - 1] and _FRAME.search(blocks[root - 1]):
        root -= 1
    frames = _FRAME.findall(blocks[root]) or _FRAME.findall(blocks[last])
    exc_type, _, message = _exception_line(blocks[last]).partition(":")
    return Cause(exc_type.strip(), _cause_frame(frames), normalise_message(message))


def finding_signature(finding: Any) -> str:
    """The versioned signature of a finding (a :class:`~shardfuzz.errors.Finding`, or anything with
    ``kind`` and ``site``): two findings with one signature are one bug. A string, for keys of
    stores and failure files: ``"v2:" + JSON [kind, *site]`` (tuples as lists)."""
    return signature_of(finding.kind, finding.site)


def signature_of(kind: str, site: Sequence[Any]) -> str:
    """The signature of a finding of ``kind`` at ``site`` (see :func:`finding_signature`)."""
    return f"v{SIGNATURE_VERSION}:" + json.dumps([kind, *site], separators=(",", ":"), sort_keys=True)


#: a rank error's traceback in its report: up to the collectives' summary (:mod:`shardfuzz.report.divergence`)
_RANK_TRACEBACK = re.compile(
    r"terminated with the following error:\n(.*?)(?=\n(?:collectives: |first divergent collective: )|\Z)",
    re.S,
)
_DIED = re.compile(r"rank \d+ died \((exit code -?\d+)\)")


def _site_from_report(kind: str, report: str) -> tuple | None:
    """A rank error's site read again from its stored report (None for other kinds: their site is
    not in the report in a form that reads back)."""
    if kind != "rank-error":
        return None
    died = _DIED.search(report)
    if died:
        return (died.group(1),)
    tb = _RANK_TRACEBACK.search(report)
    return cause_of(tb.group(1)).site() if tb else None


@dataclasses.dataclass(frozen=True)
class StoredSignature:
    """A stored finding's signature as read: current, re-keyed from an older version, or stale."""

    signature: str | None  # None: stored under an older version and not re-keyable (``stale``)
    stored_version: int  # the version it was stored under (1: stored before signatures were)
    rekeyed: bool = False

    @property
    def stale(self) -> bool:
        return self.signature is None

    def describe(self) -> str:
        if self.stale:
            return f"signature version {self.stored_version} (older than {SIGNATURE_VERSION}; not re-keyed)"
        if self.rekeyed:
            return f"re-keyed from signature version {self.stored_version}"
        return f"signature version {self.stored_version}"


def stored_signature(record: Mapping[str, Any]) -> StoredSignature:
    """The signature of a stored finding (a failure-file record, or a shared store's entry with the
    same fields: ``kind``, ``report`` and, when written by this version, ``signature``,
    ``signature_version`` and ``site``). One stored under an older version is re-keyed from its
    report (rank errors) or its stored site (other kinds); else it is returned ``stale``."""
    version = record.get("signature_version")
    version = version if isinstance(version, int) and not isinstance(version, bool) else 1
    stored = record.get("signature")
    if version == SIGNATURE_VERSION and isinstance(stored, str):
        return StoredSignature(stored, version)
    kind, report = record.get("kind"), record.get("report")
    if not isinstance(kind, str):
        return StoredSignature(None, version)
    site = _site_from_report(kind, report) if isinstance(report, str) else None
    if site is None and kind != "rank-error" and isinstance(record.get("site"), list):
        site = _tuples(record["site"])  # other kinds' sites did not change from version 1 to 2
    if site is None:
        return StoredSignature(None, version)
    return StoredSignature(signature_of(kind, site), version, rekeyed=True)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def signature_fields(finding: Any) -> dict[str, Any]:
    """The fields a stored finding carries so it can be keyed and re-keyed on read."""
    return {
        "signature": finding_signature(finding),
        "signature_version": SIGNATURE_VERSION,
        "site": json.loads(json.dumps(list(finding.site))),
    }
