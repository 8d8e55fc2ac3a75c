"""Failure files: versioned JSON records of counterexamples, written as soon as a failure is seen
and updated while Hypothesis shrinks it (an interrupted run keeps what it found).

Default directory: ``$SHARDFUZZ_FAILURES_DIR``, else ``.shardfuzz/failures`` under the current
directory. It is created and checked for writing when a :class:`FailureRecorder` is made, before
any fuzzing, so an unwritable one is a usage error up front and never loses a finding.

File targets and implementations are kept as absolute paths, plus each file's path relative to its
project root (field ``files``), so a file replays from any folder and after its checkout moved
(:mod:`shardfuzz.spec.refs`: ``--search-path``, ``$SHARDFUZZ_PATH``).

One file per (target, implementation, backend, failure kind); Hypothesis shrinks each distinct
failure separately and only ever accepts smaller failing cases, so the last case written
for a key is the smallest found so far, and after the final replay it is the shrunk one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import os
import platform
import re
import sys
from collections.abc import Iterable
from typing import Any

import hypothesis
import torch

import shardfuzz
from shardfuzz.engine.config import run_origin
from shardfuzz.engine.failure_load import load, prepare, record_impl, record_target
from shardfuzz.engine.failure_schema import FORMAT, VERSION
from shardfuzz.engine.filewriter import FileWriter, WriteFailed, check_failures_dir, default_dir, read_record
from shardfuzz.engine.finding import FindingContext
from shardfuzz.engine.hooks import RunHooks, example_order
from shardfuzz.engine.shared_db import check_database, redact
from shardfuzz.errors import Finding, InvalidArgument
from shardfuzz.protocol import RANK_RULE, ImplRef
from shardfuzz.ranks.pool_cache import remote_world
from shardfuzz.ranks.task import numerics_flags
from shardfuzz.signature import finding_signature, signature_fields
from shardfuzz.spec.refs import file_entries, load_ref

__all__ = [
    "FORMAT",
    "VERSION",
    "FailureRecorder",
    "check_failures_dir",
    "default_dir",
    "find_files",
    "load",
    "prepare",
    "record_impl",
    "record_target",
]


def source_hash(impl: ImplRef) -> str | None:
    """sha256 of the implementation's source and the arguments it is bound with (None: no source)."""
    try:
        src = inspect.getsource(load_ref(impl.ref, "impl"))
    except (OSError, TypeError, InvalidArgument):
        return None
    return hashlib.sha256((src + repr(impl.kwargs)).encode()).hexdigest()


def file_hash(impl: ImplRef) -> str | None:
    """sha256 of the file that defines the implementation (None: no such file). The function's
    own source misses a fix in a helper it calls; the docs' examples keep the logic in one."""
    try:  # as source_hash: a C function has no file (TypeError), nor has a file gone since (OSError)
        path = inspect.getsourcefile(load_ref(impl.ref, "impl"))
        if path is None:
            return None
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except (OSError, TypeError, InvalidArgument):
        return None


def versions() -> dict[str, str]:
    return {
        "shardfuzz": shardfuzz.__version__,
        "torch": torch.__version__,
        "hypothesis": hypothesis.__version__,
        "python": platform.python_version(),
    }


def _slug(text: str) -> str:
    """``text`` as a file-name piece; a long one keeps its end (an implementation given as a file
    path ends with its name: ``..._fleet_impls.py_parity_bugs``), cut with a hash of the whole."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")
    if len(slug) > 60:
        slug = hashlib.sha1(text.encode()).hexdigest()[:10] + "_" + slug[-40:].lstrip("_.-")
    return slug


class FailureRecorder(RunHooks):
    """A hook that writes a failure file for every finding (shrinking included)."""

    def __init__(self, directory: str | None = None) -> None:
        what = "--failures-dir" if directory else "$SHARDFUZZ_FAILURES_DIR (or the default)"
        if not directory and not os.environ.get("SHARDFUZZ_FAILURES_DIR"):
            what = "the default failures directory"
        #: writes safely beside other writers of the folder (see :mod:`shardfuzz.engine.filewriter`)
        # a finding is the same one only of the same target and implementation: two target files
        # of one name (a copy in another folder) wrote over each other's file of a finding
        self.writer = FileWriter(
            check_failures_dir(directory or default_dir(), what),
            same="signature",
            also=("target", "target_ref", "impl_ref", "impl_kwargs"),
        )
        self.written: dict[str, str] = {}  # path -> kind, in order
        #: failure files that could not be written (path -> why); the finding is reported anyway
        self.errors: dict[str, str] = {}
        #: per implementation: the sha256 of its source (bound arguments included) and of its file
        self._source: dict[ImplRef, tuple[str | None, str | None]] = {}
        self._order: dict[tuple, tuple] = {}  # file key -> Hypothesis' order of the case written there
        #: a campaign's run (1 first): runs after the first write their findings to files of their
        #: own until :meth:`settle` knows whether each is a new finding or one found before
        self.run = 1
        #: the files :meth:`settle` gave a finding of this run: a second distinct finding of the
        #: same key gets a file of its own
        self._settled: set[str] = set()
        #: path -> where its finding's writes went on (a file taken over gives its own finding back)
        self.moved: dict[str, str] = {}

    @property
    def directory(self) -> str:
        return self.writer.directory

    @directory.setter
    def directory(self, path: str) -> None:
        self.writer.directory = path

    def key(self, context: FindingContext, kind: str) -> tuple[str, str]:
        stem = f"{_slug(context.target)}-{_slug(context.impl)}-{context.backend}-{kind}"
        return stem, f".run{self.run}.json" if self.run > 1 else ".json"

    def path_for(self, context: FindingContext, kind: str) -> str:
        return self.writer.path(*self.key(context, kind))

    def begin_run(self, run: int) -> None:
        self.run = run
        self._settled = set()

    def settle(self, finding: Finding, distinct: bool) -> str | None:
        """After a campaign run: keep ``finding``'s file (it is a distinct finding: the first of its
        kind keeps the plain name, later ones get ``-2``, ``-3``...) or remove it (a finding seen
        before). Returns the path kept.

        One file is written per key while Hypothesis searches and shrinks: two distinct findings
        of one kind in one run (a crash on 3 ranks, another on 2) wrote over each other, and both
        were reported with the one file. Each now gets a file that holds it."""
        path = self.path_for(finding.context, finding.kind)
        if path in self._settled:  # the key's file is another finding's of this run
            return self._file_of_its_own(finding) if distinct else None
        if self.run == 1 or path not in self.written:
            if not (distinct and path in self.written):
                return None
            self._settled.add(path)
            return self.hold(path, finding)
        kind = self.written.pop(path)
        stem, suffix = self.key(finding.context, finding.kind)
        self.writer.forget(stem, suffix)
        self._settled.add(path)
        if not distinct:
            with contextlib.suppress(OSError):
                os.remove(path)
            return None
        try:
            final = self.writer.move(path, stem, ".json")
        except OSError as e:
            self.errors[path] = str(e)
            return None
        self.written[final] = kind
        return self.hold(final, finding)

    def settle_run(self, findings: Iterable[Finding]) -> list[str]:
        """After a run that is not a campaign's (``shardfuzz.run``, a ``test_for`` test): settle
        its findings as a campaign's first run does, each distinct one (by signature) in a file
        that holds it; a test's two crashes of one kind kept only one file too. Returns the files."""
        seen: set[str] = set()
        kept = []
        for finding in findings:
            if finding.context is not None:  # a finding this recorder never saw has no file
                path = self.settle(finding, distinct=finding_signature(finding) not in seen)
                seen.add(finding_signature(finding))
                kept += [path] if path is not None else []
        return kept

    def hold(self, path: str, finding: Finding) -> str:
        """Make the file ``path`` (or where its writes went on) hold ``finding``'s case: the key's
        last write may have been another finding's of the same run (or a case Hypothesis went on
        to replace, or a failure a later shrink or 1-rank try met). Returns the file."""
        path = self.where(path)
        record = read_record(path) or {}
        # the report too: a finding cut short by Ctrl-C says so in it (its file did not)
        want = {
            "case_repr": repr(finding.context.case),
            "report": finding.report,
            **signature_fields(finding),
        }
        if {k: record.get(k) for k in want} != want:
            return self.write(path, finding.context, finding) or path
        return path

    def where(self, path: str) -> str:
        """The file a finding first written to ``path`` is in now."""
        seen = {path}
        while path in self.moved and self.moved[path] not in seen:
            path = self.moved[path]
            seen.add(path)
        return path

    def _file_of_its_own(self, finding: Finding) -> str | None:
        """A new file (``-2``, ``-3``...) holding ``finding``, a distinct finding of a key whose
        file another finding of this run holds."""
        stem, _ = self.key(finding.context, finding.kind)
        try:
            path = self.writer.claim_new(stem, ".json", self._record(finding.context, finding))
        except OSError as e:  # never lose the finding over its file (as on_finding)
            self.errors[os.path.join(self.directory, stem + ".json")] = str(e)
            return None
        self.written[path] = finding.kind
        return path

    def on_finding(self, context: FindingContext, finding: Finding) -> None:
        key = self.key(context, finding.kind)
        order = example_order()
        if order is not None and key in self._order and order > self._order[key]:
            return  # Hypothesis went on generating after shrinking: keep the smaller case on file
        if order is not None:
            self._order[key] = order
        try:
            self._write(key, context, finding)
        except OSError as e:  # never lose the finding over its file; say so once, not per update
            path = getattr(e, "path", self.path_for(context, finding.kind))
            size = f"; {e.size} bytes did not fit" if isinstance(e, WriteFailed) else ""
            if not self.errors:
                print(
                    f"shardfuzz: warning: could not write the failure file {path!r}: {e}{size}",
                    file=sys.stderr,
                )
            self.errors[path] = str(e)

    def write(self, path: str, context: FindingContext, finding: Finding) -> str | None:
        """Write ``finding`` of ``context`` over ``path``, a failure file this recorder wrote (a
        finished shrink: :mod:`shardfuzz.engine.finish`), whatever its name now (a campaign's
        second distinct finding of a kind was moved to ``-2``). Returns the file it is in (another
        one when ``path`` was taken over from an earlier run and holds another finding); None when
        it could not be written."""
        path = self.where(path)
        try:
            final = self.writer.rewrite(path, self._record(context, finding))
        except OSError as e:  # never lose the finding over its file (as on_finding)
            self.errors[path] = str(e)
            return None
        if final != path:
            self.written.pop(path, None)
            self.moved[path] = final
        self.written[final] = finding.kind
        return final

    def discard(self, path: str) -> None:
        """Remove the file of the finding first written to ``path`` (:meth:`where` its writes went
        on), a finding that turned out to be one already on file (a finished shrink reached another
        finding's case). A file that holds another writer's record is never removed, and one this
        run took over from an earlier one gets its record back: the earlier run's finding stays on
        file (a new user's second campaign removed the first one's file of a finding)."""
        path = self.where(path)
        self.written.pop(path, None)
        record = read_record(path)
        if record is not None and record.get("writer") != self.writer.token:
            return
        self.writer.give_back(path)  # an earlier run's file it took over: restored, as it was

    def _write(self, key: tuple[str, str], context: FindingContext, finding: Finding) -> None:
        os.makedirs(self.directory, exist_ok=True)
        before = self.writer.owned.get(key, "")
        path = self.writer.write(*key, self._record(context, finding))
        self.written.pop(before if before != path else "", None)  # taken over by another writer
        self.written[path] = finding.kind

    def _record(self, context: FindingContext, finding: Finding) -> dict[str, Any]:
        ref, spec, case = context.impl_ref.ref, context.target_ref, context.case
        if context.impl_ref not in self._source:
            self._source[context.impl_ref] = (source_hash(context.impl_ref), file_hash(context.impl_ref))
        return {
            "format": FORMAT,
            "version": VERSION,
            "target": context.target,
            "target_ref": spec,
            "target_worker_ref": context.worker_ref,
            "impl": context.impl,
            "planted": context.planted,  # regressions() leaves these out unless asked
            "impl_ref": ref,
            "impl_kwargs": dict(context.impl_ref.kwargs),
            "files": file_entries([spec, context.worker_ref, ref]),
            "case": case.to_dict(),
            "case_repr": repr(case),
            "backend": context.backend,
            "device": context.device,
            **_rank_servers(context),
            "deterministic": context.config.deterministic,
            "kind": finding.kind,
            "ratio": finding.ratio,
            "report": finding.report,
            **signature_fields(finding),
            "trace": {str(r): [c.to_json() for c in t] for r, t in sorted(finding.traces.items())},
            "inputs_sha256": context.inputs_sha256,
            "impl_source_sha256": self._source[context.impl_ref][0],
            "impl_file_sha256": self._source[context.impl_ref][1],
            "tolerance": {
                **dataclasses.asdict(context.config.tolerance),
                "policy": context.tolerance.describe(case.dtype),
            },
            "numerics": {"driver": numerics_flags(), "rank0": context.numerics},
            "versions": versions(),
            "origin": run_origin(),  # the pytest test and xdist worker that wrote it
        }


def _rank_servers(context: FindingContext) -> dict[str, Any]:
    """On rank servers (``--ranks``): which of their ranks ran the case, by the one rule there is,
    which a replay on rank servers uses again."""
    world = remote_world()
    if context.config.ranks is None or world is None:
        return {}
    return {"rank_servers": {"rule": RANK_RULE, "world_size": world.world_size}}


def find_files(paths: Iterable[str]) -> list[str]:
    """Failure files in the given files and directories (sorted, so replays run in a stable order)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".json"))
        elif os.path.exists(p):
            out.append(p)
        elif "://" in p:  # a URL of another scheme (redi://): said as such, its password hidden
            check_database(p, "FILE|DIR")
            raise InvalidArgument(f"FILE|DIR={redact(p)!r} does not exist")
        else:
            raise InvalidArgument(f"FILE|DIR={p!r} does not exist")
    return out
