"""Replay of failure files: rerun each recorded case exactly (no search) and say whether it still
fails, now passes, or ran on different inputs than were recorded."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from shardfuzz.case import Case
from shardfuzz.engine.config import RunConfig, default_device
from shardfuzz.engine.failure_schema import printable
from shardfuzz.engine.failures import file_hash, record_impl, record_target, source_hash
from shardfuzz.engine.finding import inputs_hash
from shardfuzz.engine.runner import Runner
from shardfuzz.errors import Finding, InvalidArgument, Unsupported
from shardfuzz.signature import stored_signature
from shardfuzz.spec.exclude import Excluded
from shardfuzz.spec.tolerance import Tolerance


@dataclasses.dataclass
class Replayed:
    path: str | None  # None: a record from a store of findings
    record: dict[str, Any]
    #: "still fails" | "now passes" | "different inputs" | "another implementation" | "set aside" | "refused"
    status: str
    failed: bool
    kind: str | None = None
    report: str = ""
    note: str = ""
    signature: str | None = None  # the finding's now, when it still fails

    @property
    def not_judged(self) -> bool:
        """Set aside as a known failure or refused as unsupported: neither a pass nor a failure."""
        return self.status in ("set aside", "refused")

    def line(self) -> str:
        case = self.record["case"]
        origin = printable(os.path.basename(self.path)) if self.path else "failure record"  # a store's
        head = f"{origin}: {self.record['target']}/{printable(self.record['impl'])}"
        if self.not_judged:  # a known failure now (not run), or a refusal
            what = f"{'NOT RUN' if self.status == 'set aside' else 'REFUSED'}: {self.report}"
        elif self.status == "different inputs":
            what = f"ran on DIFFERENT INPUTS (input hash changed) and {'fails' if self.failed else 'passes'}"
        elif self.status == "another implementation":
            what = "passes, but ran ANOTHER IMPLEMENTATION than the one the file names (not a fix)"
        elif self.failed:
            what = f"STILL FAILS ({self.kind}; was {self.record['kind']}){_same_cause(self)}"
        else:
            what = "now passes"
        line = f"{head} {what}{self.note}\n  {case!r}"
        edited = case_repr_note(self.record)
        return line + f"\n  ({edited}, above)" if edited else line


def case_repr_note(record: dict[str, Any], ran: str = "ran") -> str:
    """What an edited file's ``case_repr`` says, where it is not its ``case`` (what runs); ""
    where it is. ``ran``: the verb (a replay ran it, a reproducer's script runs it)."""
    shown = record.get("case_repr")
    if isinstance(shown, str) and shown != repr(record["case"]) and not _same_case(shown, record["case"]):
        return f"the file's case_repr reads {printable(shown)}: that is not the case that {ran}, which is its field 'case'"
    return ""


def _same_case(shown: str, case: Case) -> bool:
    """``shown`` (a case's repr) is ``case`` as JSON keeps it: an option's tuple is a list in the
    file's ``case`` (a new user's tuple-valued options were each called an edited case_repr)."""
    try:
        parsed = Case.parse(shown)
    except InvalidArgument:
        return False
    return json.loads(parsed.to_json_str()) == json.loads(case.to_json_str())


def impl_note(record: dict[str, Any], target: Any, ran: str = "ran") -> str:
    """What runs where the file's ``impl_ref`` is not what the target calls its ``impl`` now (moved,
    or edited); "" where it is. ``ran``: as :func:`case_repr_note`'s."""
    name = record["impl"]
    if name in target.implementations and target.impl_ref(name) != record["impl_spec"]:
        return (
            f"what {ran} is the file's impl_ref {printable(str(record['impl_spec']))}, not the target's "
            f"implementation {printable(name)}, which is {printable(str(target.impl_ref(name)))}"
        )
    if name not in target.implementations and _label_names_another(name, record["impl_spec"].ref):
        return (
            f"what {ran} is the file's impl_ref {printable(str(record['impl_spec']))}, not its impl "
            f"{printable(name)}, which names another function"
        )
    return ""


def _label_names_another(label: str, ref: str) -> bool:
    """Whether an ``impl`` that is no implementation of the target, written as a reference itself
    (``file.py::fn``, ``module:fn``), names another function than ``ref``. A label that is not a
    reference (``reference(mean=True)``, a bound name; a planted bug renamed since) says nothing of
    the function: never a mismatch."""
    return ":" in label and _function(label) != _function(ref)


def _function(ref: str) -> str:
    """The function a reference or an implementation's label names: ``file.py::fn(k=1)`` -> ``fn``."""
    return ref.split("(", 1)[0].replace("::", ":").rsplit(":", 1)[-1]


def other_implementation(record: dict[str, Any], target: Any) -> bool:
    """Whether the file's ``impl_ref`` names another function, or binds other arguments, than the
    target's implementation of the file's ``impl`` (a hand-edited file, a rename), or another
    function than an ``impl`` that is no implementation of the target names (a file's, a module's):
    its pass says nothing of that implementation (a new user's edited file replayed the reference
    as "now passes", exit 0). A move to another module or path, the same function, is not."""
    name, theirs = record["impl"], record["impl_spec"]
    if name not in target.implementations:
        return _label_names_another(name, theirs.ref)
    ours = target.impl_ref(name)
    return _function(ours.ref) != _function(theirs.ref) or ours.kwargs != theirs.kwargs


def _same_cause(replayed: Replayed) -> str:
    """Whether a failure that still fails has the signature on file (re-keyed if stored under an
    older signature version)."""
    stored = stored_signature(replayed.record)
    if stored.stale or replayed.signature is None:
        return f", causes not compared (the file's {stored.describe()})"
    return ", same cause" if stored.signature == replayed.signature else ", A DIFFERENT CAUSE (by signature)"


def record_config(
    record: dict[str, Any],
    *,
    backend: str | None = None,
    device: str | None = None,
    debug_collectives: bool = False,
    deterministic: bool | None = None,
    timeout: float | None = None,
    tolerance: Tolerance | None = None,
    ranks: str | None = None,
    secret_file: str | None = None,
) -> RunConfig:
    """The configuration to replay a record with: the given choices, else the record's. With
    ``ranks`` the case runs on rank servers by the one rule there is (its first ``world_size``
    ranks), whatever machine found it."""
    backend = backend or record["backend"]
    if device is None:
        device = record.get("device") if backend == record["backend"] else None
    return RunConfig(
        backend=backend,
        device=device or default_device(backend),
        debug_collectives=debug_collectives,
        deterministic=bool(record.get("deterministic", False)) if deterministic is None else deterministic,
        timeout=timeout,
        tolerance=_replay_tolerance(record, tolerance),
        ranks=ranks,
        secret_file=secret_file,
    )


def _replay_tolerance(record: dict[str, Any], given: Tolerance | None) -> Tolerance:
    """The record's per-output overrides (the run's ``--tolerance``) and ``precision``, then the
    given ones on top (a given precision replaces the record's)."""
    recorded = record.get("tolerance") or {}
    precision = given.precision if given is not None and given.precision else recorded.get("precision")
    tol = Tolerance(precision=precision).with_overrides(recorded.get("per_output") or ())
    return tol.with_overrides(given.per_output) if given is not None else tol


def file_tolerance_note(record: dict[str, Any], given: Tolerance | None = None) -> str:
    """`` (judged with the file's tolerance overrides: ...)`` for the per-output tolerances a
    record carries (the run's ``--tolerance``) that replay judges with, those ``given`` replaces
    left out; empty when none. A file is someone else's input: a tolerance it loosens is said."""
    recorded = _replay_tolerance(record, None)
    replaced = {name for name, _ in given.per_output} if given is not None else set()
    kept = [(name, t) for name, t in recorded.per_output if name not in replaced]
    said = [f"{name!r} rtol={t.rtol!r} atol={t.atol!r}" for name, t in kept]
    if recorded.precision and not (given is not None and given.precision):
        said.append(f"precision={recorded.precision!r}")
    return f" (judged with the file's tolerance overrides: {', '.join(said)})" if said else ""


#: how many times a replay runs a case that passes before it says the case now passes
REPLAY_RUNS = 3


def replay_one(record: dict[str, Any], **choices: Any) -> Replayed:
    """Rerun one failure record's case (``choices``: see :func:`record_config`)."""
    target, _ = record_target(record)
    runner = Runner(target, record_impl(target, record), record_config(record, **choices))
    case = record["case"]
    note = ""
    src = source_hash(runner.impl_ref)
    if record.get("impl_source_sha256") and src and src != record["impl_source_sha256"]:
        note = " (the implementation's source or bound arguments changed since)"
    elif record.get("impl_file_sha256") and record["impl_file_sha256"] != file_hash(runner.impl_ref):
        # the function is the same, its file is not: a helper it calls may have changed
        note = " (the file that defines the implementation changed since)"
    ran = impl_note(record, target)
    if ran:
        note += f" ({ran})"
    note += file_tolerance_note(record, choices.get("tolerance"))
    try:
        failed, kind, report, signature = False, None, "", None
        # a pass is run again: a race (an async all-reduce never waited on) passed 1 run in 6 for
        # a new user, and one passing replay read as the bug fixed
        for attempt in range(1, REPLAY_RUNS + 1):
            try:
                runner.run_case(case)
            except Finding as f:
                failed, kind, report, signature = True, f.kind, f.report, f.signature
                if attempt > 1:
                    note += (
                        f" (it passed {attempt - 1} run(s) first, then failed on run {attempt}: intermittent)"
                    )
                break
        else:
            note += f" (passed {REPLAY_RUNS} runs of {REPLAY_RUNS})"
    except Unsupported as e:  # a known failure, or a refusal (the target's or the implementation's)
        # added since: neither a pass nor a failure, said as what it is
        known = isinstance(e, Excluded)
        what = "set aside as a known failure" if known else "refused as unsupported"
        status = "set aside" if known else "refused"
        return Replayed(record["path"], record, status, False, report=f"{what} now ({e})", note=note)
    same_inputs = inputs_hash(runner.last_inputs) == record["inputs_sha256"]
    status = "different inputs" if not same_inputs else ("still fails" if failed else "now passes")
    if status == "now passes" and other_implementation(record, target):
        status = "another implementation"
    return Replayed(record["path"], record, status, failed, kind, report, note, signature)
