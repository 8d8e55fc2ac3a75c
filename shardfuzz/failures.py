"""Failure files: versioned JSON records of counterexamples, written as soon as a failure is seen
and updated while Hypothesis shrinks it (an interrupted run keeps what it found).

Default directory: ``$SHARDFUZZ_FAILURES_DIR``, else ``.shardfuzz/failures`` under the current
directory. It is created and checked for writing when a :class:`FailureRecorder` is made, before
any fuzzing, so an unwritable one is a usage error up front and never loses a finding.

File targets and implementations are kept as absolute paths, plus each file's path relative to its
project root (field ``files``), so a file replays from any folder and after its checkout moved
(:mod:`shardfuzz.refs`: ``--search-path``, ``$SHARDFUZZ_PATH``).

One file per (target, implementation, backend, failure kind); Hypothesis shrinks each distinct
failure separately and only ever accepts smaller failing cases, so the last case written
for a key is the smallest found so far, and after the final replay it is the shrunk one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import inspect
import json
import os
import platform
import re
import sys
import tempfile
from collections.abc import Iterable

import shardfuzz
from shardfuzz.config import run_origin
from shardfuzz.errors import Finding, InvalidArgument
from shardfuzz.failure_load import load, prepare, record_impl, record_target
from shardfuzz.failure_schema import FORMAT, VERSION
from shardfuzz.finding import FindingContext
from shardfuzz.hooks import RunHooks, example_order
from shardfuzz.protocol import ImplRef
from shardfuzz.rank import numerics_flags
from shardfuzz.refs import file_entries, load_ref
from shardfuzz.signature import signature_fields

__all__ = [
    "FORMAT",
    "VERSION",
    "FailureRecorder",
    "find_files",
    "load",
    "prepare",
    "record_impl",
    "record_target",
]


def default_dir() -> str:
    return os.environ.get("SHARDFUZZ_FAILURES_DIR") or os.path.join(".shardfuzz", "failures")


def check_failures_dir(path: str, what: str = "--failures-dir") -> str:
    """Create the failures directory if needed and make sure a file can be written there; an
    InvalidArgument naming ``what`` and the path otherwise. Returns the path."""
    if not isinstance(path, str) or not path:
        raise InvalidArgument(f"{what}={path!r}; must be a directory path")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        why = "a file is in the way" if isinstance(e, FileExistsError) else e.strerror
        raise InvalidArgument(
            f"{what}={path!r}: cannot create the directory ({why}); give a writable directory"
        ) from None
    if not os.path.isdir(path):
        raise InvalidArgument(f"{what}={path!r} is not a directory; give a writable directory")
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".shardfuzz-write-check-")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise InvalidArgument(
            f"{what}={path!r}: cannot write there ({e.strerror}); give a writable directory"
        ) from None
    return path


def source_hash(impl: ImplRef) -> str | None:
    """sha256 of the implementation's source and the arguments it is bound with (None: no source)."""
    try:
        src = inspect.getsource(load_ref(impl.ref, "impl"))
    except (OSError, TypeError, InvalidArgument):
        return None
    return hashlib.sha256((src + repr(impl.kwargs)).encode()).hexdigest()


def versions() -> dict[str, str]:
    import hypothesis
    import torch

    return {
        "shardfuzz": shardfuzz.__version__,
        "torch": torch.__version__,
        "hypothesis": hypothesis.__version__,
        "python": platform.python_version(),
    }


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")
    if len(slug) > 60:
        slug = slug[:40] + "_" + hashlib.sha1(text.encode()).hexdigest()[:10]
    return slug


class FailureRecorder(RunHooks):
    """A hook that writes a failure file for every finding (shrinking included)."""

    def __init__(self, directory: str | None = None) -> None:
        what = "--failures-dir" if directory else "$SHARDFUZZ_FAILURES_DIR (or the default)"
        if not directory and not os.environ.get("SHARDFUZZ_FAILURES_DIR"):
            what = "the default failures directory"
        self.directory = check_failures_dir(directory or default_dir(), what)
        self.written: dict[str, str] = {}  # path -> kind, in order
        #: failure files that could not be written (path -> why); the finding is reported anyway
        self.errors: dict[str, str] = {}
        self._source: dict[ImplRef, str | None] = {}
        self._order: dict[str, tuple] = {}  # path -> Hypothesis' order of the case written there
        #: a campaign's run (1 first): runs after the first write their findings to files of their
        #: own until :meth:`settle` knows whether each is a new finding or one found before
        self.run = 1

    def path_for(self, context: FindingContext, kind: str) -> str:
        stem = f"{_slug(context.target)}-{_slug(context.impl)}-{context.backend}-{kind}"
        suffix = f".run{self.run}.json" if self.run > 1 else ".json"
        return os.path.join(self.directory, stem + suffix)

    def begin_run(self, run: int) -> None:
        self.run = run

    def settle(self, finding: Finding, distinct: bool) -> str | None:
        """After a campaign run: keep ``finding``'s file (it is a distinct finding: the first of its
        kind keeps the plain name, later ones get ``-2``, ``-3``...) or remove it (a finding seen
        before). Returns the path kept."""
        path = self.path_for(finding.context, finding.kind)
        if self.run == 1 or path not in self.written:
            return path if distinct and path in self.written else None
        kind = self.written.pop(path)
        if not distinct:
            with contextlib.suppress(OSError):
                os.remove(path)
            return None
        stem = path[: -len(f".run{self.run}.json")]
        final, n = f"{stem}.json", 1
        while final in self.written:
            n += 1
            final = f"{stem}-{n}.json"
        try:
            os.replace(path, final)
        except OSError as e:
            self.errors[final] = str(e)
            return None
        self.written[final] = kind
        return final

    def on_finding(self, context: FindingContext, finding: Finding) -> None:
        path = self.path_for(context, finding.kind)
        order = example_order()
        if order is not None and path in self._order and order > self._order[path]:
            return  # Hypothesis went on generating after shrinking: keep the smaller case on file
        if order is not None:
            self._order[path] = order
        try:
            self._write(path, context, finding)
        except OSError as e:  # never lose the finding over its file
            self.errors[path] = str(e)
            print(f"shardfuzz: warning: could not write the failure file {path!r}: {e}", file=sys.stderr)

    def write(self, path: str, context: FindingContext, finding: Finding) -> None:
        """Write ``finding`` of ``context`` to ``path`` (also :mod:`shardfuzz.finish`: a finished shrink)."""
        self._write(path, context, finding)

    def _write(self, path: str, context: FindingContext, finding: Finding) -> None:
        os.makedirs(self.directory, exist_ok=True)
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        created, updates = now, 0
        if os.path.exists(path):
            try:
                with open(path) as f:
                    old = json.load(f)
                created, updates = old.get("created", now), int(old.get("updates", 0)) + 1
            except (OSError, ValueError):
                pass
        ref, spec, case = context.impl_ref.ref, context.target_ref, context.case
        if context.impl_ref not in self._source:
            self._source[context.impl_ref] = source_hash(context.impl_ref)
        record = {
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
            "deterministic": context.config.deterministic,
            "kind": finding.kind,
            "ratio": finding.ratio,
            "report": finding.report,
            **signature_fields(finding),
            "trace": {str(r): [c.to_json() for c in t] for r, t in sorted(finding.traces.items())},
            "inputs_sha256": context.inputs_sha256,
            "impl_source_sha256": self._source[context.impl_ref],
            "tolerance": {
                **dataclasses.asdict(context.config.tolerance),
                "policy": context.tolerance.describe(case.dtype),
            },
            "numerics": {"driver": numerics_flags(), "rank0": context.numerics},
            "versions": versions(),
            "created": created,
            "updated": now,
            "updates": updates,
            "origin": run_origin(),  # the pytest test and xdist worker that wrote it
        }
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
        self.written[path] = finding.kind


def find_files(paths: Iterable[str]) -> list[str]:
    """Failure files in the given files and directories (sorted, so replays run in a stable order)."""
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            out += sorted(os.path.join(p, n) for n in os.listdir(p) if n.endswith(".json"))
        elif os.path.exists(p):
            out.append(p)
        else:
            raise InvalidArgument(f"FILE|DIR={p!r} does not exist")
    return out
