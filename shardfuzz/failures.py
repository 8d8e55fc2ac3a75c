"""Failure files: versioned JSON records of counterexamples, written as soon as a failure is seen
and updated while Hypothesis shrinks it (an interrupted run keeps what it found).

Default directory: ``$SHARDFUZZ_FAILURES_DIR``, else ``.shardfuzz/failures`` under the current
directory. It is created and checked for writing when a :class:`FailureRecorder` is made, before
any fuzzing, so an unwritable one is a usage error up front and never loses a finding.

File targets and implementations are kept as absolute paths, plus each file's path relative to its
project root (field ``files``), so a file replays from any folder and after its checkout moved
(:mod:`shardfuzz.refs`: ``--search-path``, ``$SHARDFUZZ_PATH``).

One file per (target, implementation, backend, failure kind): the smallest case found so far, after
the final replay the shrunk one; with its versioned signature (:mod:`shardfuzz.signature`).
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
from typing import Any

import shardfuzz
from shardfuzz.case import Case
from shardfuzz.config import BACKENDS, DEVICES
from shardfuzz.errors import Finding, InvalidArgument
from shardfuzz.hooks import RunHooks, example_order
from shardfuzz.oracle import check_case
from shardfuzz.protocol import ImplRef
from shardfuzz.rank import numerics_flags
from shardfuzz.refs import file_entries, load_ref, ref_of_callable, relocate_ref, split_file_ref
from shardfuzz.registry import get_target, target_spec
from shardfuzz.runner import Runner
from shardfuzz.signature import signature_fields
from shardfuzz.target import Target

FORMAT = "shardfuzz-failure"
VERSION = 1
REQUIRED = ("target", "impl", "impl_ref", "case", "backend", "device", "kind", "report", "inputs_sha256")


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


def inputs_hash(inputs: dict[str, Any]) -> str:
    """sha256 over every input's name, dtype, shape and bytes (bf16 as its bits)."""
    import torch

    h = hashlib.sha256()
    for name in sorted(inputs):
        v = inputs[name]
        h.update(name.encode())
        if isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            if t.dtype == torch.bfloat16:
                t = t.view(torch.int16)
            h.update(t.numpy().tobytes())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


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
        self._spec: dict[Target, str] = {}  # target -> its full reference (rerun lines, replay)
        self._order: dict[str, tuple] = {}  # path -> Hypothesis' order of the case written there
        #: a campaign's run (1 first): runs after the first write their findings to files of their
        #: own until :meth:`settle` knows whether each is a new finding or one found before
        self.run = 1

    def path_for(self, runner: Runner, kind: str) -> str:
        stem = f"{_slug(runner.target.name)}-{_slug(runner.impl_name)}-{runner.backend}-{kind}"
        suffix = f".run{self.run}.json" if self.run > 1 else ".json"
        return os.path.join(self.directory, stem + suffix)

    def begin_run(self, run: int) -> None:
        self.run = run

    def settle(self, runner: Runner, finding: Finding, distinct: bool) -> str | None:
        """After a campaign run: keep ``finding``'s file (it is a distinct finding: the first of its
        kind keeps the plain name, later ones get ``-2``, ``-3``...) or remove it (a finding seen
        before). Returns the path kept."""
        path = self.path_for(runner, finding.kind)
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

    def on_finding(self, runner: Runner, case: Case, finding: Finding) -> None:
        path = self.path_for(runner, finding.kind)
        order = example_order()
        if order is not None and path in self._order and order > self._order[path]:
            return  # Hypothesis went on generating after shrinking: keep the smaller case on file
        if order is not None:
            self._order[path] = order
        try:
            self.write(path, runner, case, finding)
        except OSError as e:  # never lose the finding over its file
            self.errors[path] = str(e)
            print(f"shardfuzz: warning: could not write the failure file {path!r}: {e}", file=sys.stderr)

    def write(self, path: str, runner: Runner, case: Case, finding: Finding) -> None:
        """Write ``finding`` at ``case`` (the runner's last) to ``path`` (also :mod:`shardfuzz.finish`)."""
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
        ref = runner.impl_ref.ref
        if runner.target not in self._spec:
            self._spec[runner.target] = target_spec(runner.target)
        spec = self._spec[runner.target]
        if runner.impl_ref not in self._source:
            self._source[runner.impl_ref] = source_hash(runner.impl_ref)
        record = {
            "format": FORMAT,
            "version": VERSION,
            "target": runner.target.name,
            "target_ref": spec,
            "target_worker_ref": runner.worker_target,
            "impl": runner.impl_name,
            "impl_ref": ref,
            "impl_kwargs": dict(runner.impl_ref.kwargs),
            "files": file_entries([spec, runner.worker_target, ref]),
            "case": case.to_dict(),
            "case_repr": repr(case),
            "backend": runner.backend,
            "device": runner.device,
            "deterministic": runner.config.deterministic,
            "kind": finding.kind,
            "ratio": finding.ratio,
            "report": finding.report,
            **signature_fields(finding),
            "trace": {str(r): [c.to_json() for c in t] for r, t in sorted(finding.traces.items())},
            "inputs_sha256": inputs_hash(runner.last_inputs),
            "impl_source_sha256": self._source[runner.impl_ref],
            "tolerance": {
                **dataclasses.asdict(runner.config.tolerance),
                "policy": runner.tolerance.describe(case.dtype),
            },
            "numerics": {"driver": numerics_flags(), "rank0": runner.numerics},
            "versions": versions(),
            "created": created,
            "updated": now,
            "updates": updates,
        }
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
        self.written[path] = finding.kind


def load(path: str, *, check: bool = True) -> dict[str, Any]:
    """Read and validate a failure file (see :func:`prepare`); errors name the file and the field."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise InvalidArgument(f"failure file {path!r}: cannot read it: {e.strerror}") from None
    except ValueError as e:
        raise InvalidArgument(f"failure file {path!r}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise InvalidArgument(
            f"failure file {path!r}: field 'format' is {got!r}, expected {FORMAT!r} (a foreign file?)"
        )
    version = data.get("version")
    if not isinstance(version, int):
        raise InvalidArgument(f"failure file {path!r}: field 'version' is {version!r}, expected an integer")
    if version > VERSION:
        raise InvalidArgument(
            f"failure file {path!r}: format version {version} is newer than this shardfuzz reads ({VERSION}); "
            "upgrade shardfuzz to replay it"
        )
    for field in REQUIRED:
        if field not in data:
            raise InvalidArgument(f"failure file {path!r}: field {field!r} is missing")
    return prepare(data, path, check=check)


def prepare(data: dict[str, Any], path: str, *, check: bool = True) -> dict[str, Any]:
    """Validate a record's fields, find its files again (they may have moved: see
    :mod:`shardfuzz.refs`) and, with ``check``, resolve its target and implementation and check its
    case against the target. Every error names the file and the field."""
    where = f"failure file {path!r}"
    if not isinstance(data["case"], (dict, Case)):
        raise InvalidArgument(f"{where}: field 'case' must be an object, got {data['case']!r}")
    try:
        if not isinstance(data["case"], Case):
            data["case"] = Case.from_dict(data["case"])
    except (InvalidArgument, TypeError) as e:
        raise InvalidArgument(f"{where}: field 'case' is invalid: {e}") from None
    for field, kind in (("impl_kwargs", dict), ("files", dict), ("impl_ref", str), ("target", str)):
        if data.get(field) is not None and not isinstance(data[field], kind):
            raise InvalidArgument(f"{where}: field {field!r} is {data[field]!r}, expected a {kind.__name__}")
    for field in ("target_ref", "target_worker_ref", "impl_ref"):
        if isinstance(data.get(field), str):
            data[field] = _field(where, field, relocate_ref, data[field], data.get("files") or {}, field)
    data["path"] = path
    data["impl_spec"] = ImplRef.from_parts(data["impl_ref"], data.get("impl_kwargs") or {})
    if check:
        target, _ = _field(where, "target_ref", record_target, data)
        _field(where, "impl_ref", ref_of_callable, data["impl_ref"], "impl")
        for field, allowed in (("backend", BACKENDS), ("device", DEVICES)):
            if data[field] not in allowed:
                raise InvalidArgument(
                    f"{where}: field {field!r} is {data[field]!r}; allowed: {', '.join(allowed)}"
                )
        case = data["case"]
        try:
            check_case(target, case)
        except InvalidArgument as e:
            raise InvalidArgument(f"{where}: field 'case' is invalid: {e}") from None
    return data


def _field(where: str, field: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except InvalidArgument as e:
        raise InvalidArgument(f"{where}: field {field!r}: {e}") from None


def record_target(record: dict[str, Any]) -> tuple[Target, str]:
    """The target of a failure record and how it was named (its full reference when it has one; a
    file that cannot be found is an error, never replaced by a target of the same name)."""
    spec = record.get("target_ref") or record["target"]
    try:
        return get_target(spec), spec
    except InvalidArgument:
        if spec == record["target"] or split_file_ref(spec) is not None:
            raise
    return get_target(record["target"]), record["target"]


def record_impl(target: Target, record: dict[str, Any]) -> Any:
    """The record's implementation: by name when the target still has it under that name."""
    name = record["impl"]
    if name in target.implementations and target.impl_ref(name) == record["impl_spec"]:
        return name
    return record["impl_spec"]


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
