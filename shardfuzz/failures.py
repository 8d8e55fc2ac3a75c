"""Failure files: versioned JSON records of counterexamples, written as soon as a failure is seen
and updated while Hypothesis shrinks it (an interrupted run keeps what it found).

Default directory: ``$SHARDFUZZ_FAILURES_DIR``, else ``.shardfuzz/failures`` under the current
directory. One file per (target, implementation, backend, failure kind); Hypothesis shrinks each
distinct failure separately and only ever accepts smaller failing cases, so the last case written
for a key is the smallest found so far, and after the final replay it is the shrunk one.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import inspect
import json
import os
import platform
import re
from collections.abc import Iterable
from typing import Any

import shardfuzz
from shardfuzz.case import Case
from shardfuzz.errors import Finding, InvalidArgument
from shardfuzz.hooks import RunHooks
from shardfuzz.protocol import ImplRef
from shardfuzz.rank import numerics_flags
from shardfuzz.refs import load_ref
from shardfuzz.runner import Runner

FORMAT = "shardfuzz-failure"
VERSION = 1
REQUIRED = ("target", "impl", "impl_ref", "case", "backend", "device", "kind", "report", "inputs_sha256")


def default_dir() -> str:
    return os.environ.get("SHARDFUZZ_FAILURES_DIR") or os.path.join(".shardfuzz", "failures")


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
        self.directory = directory or default_dir()
        self.written: dict[str, str] = {}  # path -> kind, in order
        self._source: dict[ImplRef, str | None] = {}

    def path_for(self, runner: Runner, kind: str) -> str:
        name = f"{_slug(runner.target.name)}-{_slug(runner.impl_name)}-{runner.backend}-{kind}.json"
        return os.path.join(self.directory, name)

    def on_finding(self, runner: Runner, case: Case, finding: Finding) -> None:
        os.makedirs(self.directory, exist_ok=True)
        path = self.path_for(runner, finding.kind)
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
        if runner.impl_ref not in self._source:
            self._source[runner.impl_ref] = source_hash(runner.impl_ref)
        record = {
            "format": FORMAT,
            "version": VERSION,
            "target": runner.target.name,
            "target_ref": runner.target_spec
            if runner.target_spec != runner.target.name
            else runner.target.name,
            "target_worker_ref": runner.worker_target,
            "impl": runner.impl_name,
            "impl_ref": ref,
            "impl_kwargs": dict(runner.impl_ref.kwargs),
            "case": case.to_dict(),
            "case_repr": repr(case),
            "backend": runner.backend,
            "device": runner.device,
            "deterministic": runner.config.deterministic,
            "kind": finding.kind,
            "ratio": finding.ratio,
            "report": finding.report,
            "inputs_sha256": inputs_hash(runner.last_inputs),
            "impl_source_sha256": self._source[runner.impl_ref],
            "tolerance": {
                **dataclasses.asdict(runner.config.tolerance),
                "policy": runner.config.tolerance.describe(),
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


def load(path: str) -> dict[str, Any]:
    """Read and validate a failure file; errors name the file and the field."""
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
    if not isinstance(data["case"], dict):
        raise InvalidArgument(f"failure file {path!r}: field 'case' must be an object, got {data['case']!r}")
    try:
        data["case"] = Case.from_dict(data["case"])
    except (InvalidArgument, TypeError) as e:
        raise InvalidArgument(f"failure file {path!r}: field 'case' is invalid: {e}") from None
    data["path"] = path
    data["impl_spec"] = ImplRef.from_parts(data["impl_ref"], data.get("impl_kwargs") or {})
    return data


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
