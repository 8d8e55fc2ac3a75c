"""Exceptions.

Two families:

* :class:`ShardfuzzError` and its subclasses are problems with the *fuzzer* or its input: a bad
  argument (:class:`InvalidArgument`), a target that cannot be found or imported, a pool that would
  not start (:class:`InfrastructureError`).
* :class:`Finding` and its subclasses are *counterexamples*: the sharded code disagreed with the
  oracle. Each kind is its own class and is raised from its own function, because Hypothesis tells
  distinct bugs apart by exception type and raise site; one shared raise site lets a shrink drift
  from one bug into another.
"""

from __future__ import annotations

import traceback
from typing import Any

from shardfuzz.signature import finding_signature


class ShardfuzzError(Exception):
    """Base class for errors of the fuzzer itself (not findings)."""


class ShardfuzzWarning(UserWarning):
    """Something a run was given that is allowed but likely not meant (a pinned option value the
    target never draws: a misspelling?). The CLI prints it as ``shardfuzz: warning: ...``."""


class InvalidArgument(ShardfuzzError, ValueError):
    """An argument is invalid. The message names the argument, its value and what is allowed."""


class CaseOutsideBounds(InvalidArgument):
    """A failure file, valid otherwise, whose case its target no longer draws (the target's sizes,
    meshes or options changed since the file was written): a replay of a folder sets it aside and
    replays the rest; every other check of a file refuses the whole replay."""


class TargetError(InvalidArgument):
    """A target or implementation cannot be found, is missing a piece, or cannot reach the workers."""


class TargetCodeError(TargetError):
    """The target's own code (its ``inputs``, ``oracle``, ``magnitude`` or ``outputs`` function)
    raised on a case. That is neither a finding of the implementation nor a failure of shardfuzz:
    the message holds the target's traceback, and the CLI exits 2 (a usage error: the spec, or a
    hand-made case, is wrong)."""

    @classmethod
    def of(
        cls, target: str, piece: str, case: Any, exc: BaseException, hint: str = "", remedy: str = ""
    ) -> TargetCodeError:
        """The error for ``exc`` raised by ``target``'s ``piece`` on ``case``, ``remedy`` last; the
        traceback keeps only the target's frames (the first frame is shardfuzz's call site)."""
        frames = traceback.extract_tb(exc.__traceback__)[1:]
        tb = "".join(traceback.format_list(frames))
        what = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return cls(
            f"target {target!r}: its {piece} raised {what}\n  on {case!r}"
            + (f"\n  {hint}" if hint else "")
            + (f"\nThe target's traceback (most recent call last):\n{tb.rstrip()}" if tb else "")
            + (f"\n{remedy}" if remedy else "")
        )


class NoiseModelRefusal(TargetError):
    """The noise model refuses the code it runs (a hand-written softmax whose max gradients flow
    through, DTensor code it cannot perturb): the message names the remedy. ``in_code``: the
    remedy is a change to that code (not a setting)."""

    def __init__(self, message: str = "", *, in_code: bool = True) -> None:
        super().__init__(message)
        self.in_code = in_code


class InfrastructureError(ShardfuzzError):
    """The fuzzer itself failed: a pool would not start, a worker could not be reached."""


class RankSetupError(InfrastructureError):
    """A rank could not load the target or implementation that the driver loaded: that rank's
    environment differs (a file missing on another node, another ``PYTHONPATH``), not a finding."""


class ExternalFault(InfrastructureError):
    """A rank was killed by a signal from outside the example (SIGKILL, SIGTERM: the OOM killer, a
    user, a CI timeout) and the same case passed when rerun on fresh ranks: not a finding of the
    implementation. Inside a search the example is set aside and counted."""


class ImplementationReturnError(TypeError):
    """An implementation returned something other than a dict of outputs: its contract with
    shardfuzz, not its math (raised on the rank; its report says so, whatever the world size)."""


class Unsupported(Exception):
    """A case that a target (its ``supports`` hook) or an implementation (raising this on *every*
    rank, before any collective) cannot handle.

    The case is rejected (Hypothesis draws another), never passed silently, and counted by reason in
    ``Result.stats.unsupported`` and in the summary line. ``reason`` is the short reason counted
    there (default: the message).
    """

    def __init__(self, message: str = "", *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message

    def __reduce__(self) -> tuple[Any, ...]:  # keep the reason through pickling
        return (_rebuild_unsupported, (str(self), self.reason))


def _rebuild_unsupported(message: str, reason: str) -> Unsupported:
    return Unsupported(message, reason=reason)


class Finding(AssertionError):
    """A counterexample. ``case`` is the :class:`~shardfuzz.Case`, ``report`` the full text.

    Subclasses AssertionError so pytest shows it as a test failure, not an error in the tool.
    """

    kind: str = "finding"
    #: on 1 rank its report says the bug is in a rank's own work (not for a communication budget,
    #: an ignored collective, nor a return value that breaks the implementation's contract)
    notes_one_rank: bool = True

    def __init__(
        self, report: str, *, case: Any = None, ratio: float | None = None, site: tuple = ()
    ) -> None:
        super().__init__(report)
        self.report = report
        self.case = case
        #: greatest error/tolerance over the compared elements (mismatches only)
        self.ratio = ratio
        #: what tells this finding from another of its kind at its minimal case: the wrong outputs
        #: and their ranks (mismatch), the exception, its cause frame and its normalised message
        #: (rank-error: :func:`shardfuzz.signature.cause_of`), the ranks that hung (hang)
        self.site = tuple(site)
        #: global rank -> the collectives it entered (:class:`~shardfuzz.ranks.trace.Collective`)
        self.traces: dict[int, Any] = {}
        #: global state the example left behind (its report says so too)
        self.leaks: tuple[str, ...] = ()
        #: the :class:`~shardfuzz.engine.finding.FindingContext` the runner builds when it raises this
        self.context: Any = None

    @property
    def signature(self) -> str:
        """Versioned kind and site (:func:`shardfuzz.signature.finding_signature`): two shrunk
        findings with one signature are one bug (campaigns)."""
        return finding_signature(self)

    def __reduce__(self) -> tuple[Any, ...]:  # keep the keyword arguments and the attributes through pickling
        return (_rebuild, (type(self), self.report, self.case, self.ratio, self.site, dict(self.__dict__)))


def _rebuild(
    cls: type[Finding],
    report: str,
    case: Any,
    ratio: float | None,
    site: tuple = (),
    attributes: dict[str, Any] | None = None,
) -> Finding:
    err = cls(report, case=case, ratio=ratio, site=site)
    err.__dict__.update(attributes or {})
    return err


class Mismatch(Finding):
    """Values on some rank differ from the oracle by more than the tolerance.

    ``outputs`` maps each mismatching output to the ranks whose shards hold wrong elements;
    ``diffs`` holds their comparisons, values included, for ``shardfuzz case --plot`` (in this
    process only: never pickled).
    """

    kind = "mismatch"
    outputs: dict[str, list[int]] = {}
    diffs: list[Any] = []

    def __reduce__(
        self,
    ) -> tuple[Any, ...]:  # diffs hold tensors and layouts' index maps: kept in this process
        rebuild, args = super().__reduce__()
        return (rebuild, (*args[:-1], {k: v for k, v in args[-1].items() if k != "diffs"}))


class LayoutMismatch(Finding):
    """A rank's local shape or dtype is not what the output's layout says it must be (where the
    target's reference fails so too, its declared layout is wrong)."""

    kind = "layout"
    #: what is wrong, one line per output and rank (the summary names the first)
    problems: tuple[str, ...] = ()


class RankError(Finding):
    """An exception was raised on a rank. The report has that rank's traceback and output."""

    kind = "rank-error"


class RankHang(Finding):
    """The example did not finish in time (or a collective timed out). The report has every rank's stack."""

    kind = "hang"


class CommunicationExceeded(Finding):
    """A rank sent more than the implementation's declared communication budget for the case
    (:class:`~shardfuzz.verdict.comm.CommBudget`): a redundant or oversized collective, right values or not."""

    kind = "communication"
    notes_one_rank = False


class IgnoredCollective(Finding):
    """Autograd went through a collective that has no autograd kernel and silently treated it as
    identity: reported whatever the values (they are not compared)."""

    kind = "ignored-collective"
    notes_one_rank = False
