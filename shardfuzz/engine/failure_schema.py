"""The schema of a failure file, checked as a whole before anything it names is imported or run.

A failure file is untrusted input: users attach them to issues, commit them, and share them through
a store of findings. :func:`load_failure_file` reads one (bounded in bytes) and
:func:`validate_failure_record` checks a record of any origin (a file, a database row) field by
field: every error names the file (or the record's origin) and the field, with the value escaped.
Neither imports a target or an implementation; that is :mod:`shardfuzz.engine.trust`'s decision, taken
after this check (see ``docs/trust.md``).

Versions: ``version`` 1 is the only format so far. A record without ``version`` (older files) is
read as version 1; a newer version is refused with a request to upgrade shardfuzz. Fields this
version does not know are ignored (they are never imported, run or printed).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

from shardfuzz.case import Case
from shardfuzz.engine.config import BACKENDS, DEVICES
from shardfuzz.errors import InvalidArgument
from shardfuzz.protocol import RANK_RULE
from shardfuzz.spec.records import KINDS
from shardfuzz.spec.tolerance import Tolerance

FORMAT = "shardfuzz-failure"
VERSION = 1
#: a failure file larger than this is refused before it is parsed (real ones are a few kB to a few
#: hundred kB: the report and the collective trace of the shrunk case)
MAX_FILE_BYTES = 16 * 2**20

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
_MODULE_REF = re.compile(rf"{_DOTTED}:{_DOTTED}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def shown(value: Any, limit: int = 200) -> str:
    """An untrusted value as it may be printed: ``repr`` (control characters and terminal escapes
    come out as ``\\x1b``...), cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str) -> str:
    """An untrusted string with its control characters (terminal escapes, newlines) escaped, for
    messages that show it unquoted."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _sha256_or_null(value: Any) -> str | None:
    return (
        None
        if value is None or (isinstance(value, str) and _HEX64.fullmatch(value))
        else "must be 64 hex digits or null"
    )


def _plain_text(value: Any, limit: int = 1000) -> str | None:
    if not isinstance(value, str):
        return "must be a string"
    if _CONTROL.search(value):
        return "must not hold control characters (newlines, terminal escapes)"
    if len(value) > limit:
        return f"must be at most {limit} characters"
    return None


def ref_problem(value: Any) -> str | None:
    """Why ``value`` is not a well-formed reference (``pkg.mod:attr``, ``file.py::NAME``, a bare
    ``file.py`` or a registered target name), or None."""
    if (why := _plain_text(value)) is not None:
        return why
    if re.fullmatch(_IDENT, value) or _MODULE_REF.fullmatch(value):
        return None
    path, sep, attr = value.rpartition("::")
    if sep and path.endswith(".py") and (not attr or re.fullmatch(_DOTTED, attr)):
        return None
    if not sep and value.endswith(".py") and "::" not in value:
        return None
    return "must be 'pkg.mod:attr', 'path/file.py::NAME', 'path/file.py' or a target name"


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _one_of(allowed: tuple[str, ...]) -> Callable[[Any], str | None]:
    return lambda v: None if isinstance(v, str) and v in allowed else f"allowed: {', '.join(allowed)}"


def _kwargs_problem(v: Any) -> str | None:
    if not isinstance(v, dict):
        return "must be an object of argument name -> value"
    for k, x in v.items():
        if not re.fullmatch(_IDENT, k):
            return f"argument name {shown(k)} is not an identifier"
        if not isinstance(x, (str, int, float, bool, type(None))) or (isinstance(x, str) and _plain_text(x)):
            return f"argument {k}={shown(x)} must be a JSON str, int, float, bool or null without control characters"
    return None


def _files_problem(v: Any) -> str | None:
    if not isinstance(v, dict):
        return "must be an object of absolute path -> path relative to its project root"
    for k, x in v.items():
        if _plain_text(k) or _plain_text(x) or not str(k).endswith(".py") or not str(x).endswith(".py"):
            return f"entry {shown(k)}: {shown(x)} must map a .py path to a .py path"
    return None


def _tolerance_problem(v: Any) -> str | None:
    if not isinstance(v, dict):
        return "must be an object (the tolerance the run used)"
    if "policy" in v and not isinstance(v["policy"], str):
        return "'policy' must be a string"
    try:
        # a field this version does not know (a newer shardfuzz's) is ignored, as elsewhere in the file
        known = {f.name for f in dataclasses.fields(Tolerance)}
        Tolerance(**{k: x for k, x in v.items() if k in known})
    except (InvalidArgument, TypeError) as e:
        return str(e)
    return None


def _dict_of_str(v: Any) -> str | None:
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, str) for k, x in v.items()):
        return "must be an object of strings"
    return None


def _trace_problem(v: Any) -> str | None:
    if not isinstance(v, dict) or not all(isinstance(k, str) and isinstance(x, list) for k, x in v.items()):
        return "must be an object of rank -> list of collectives"
    return None


#: how deeply a finding's site nests (an output, its ranks, an element's index: 3 and less); a site
#: nested 900 deep passed as "a list" and stopped a replay after its case ran (RecursionError)
SITE_DEPTH = 6


def _site_problem(v: Any, depth: int) -> str | None:
    if not isinstance(v, list):
        return "must be a list"
    if depth <= 0:
        return f"must be a list of lists of JSON scalars nested at most {SITE_DEPTH} deep"
    for item in v:
        if isinstance(item, list):
            problem = _site_problem(item, depth - 1)
            if problem is not None:
                return problem
        elif not isinstance(item, (str, int, float, bool, type(None))):
            return "must hold lists and JSON scalars only"
    return None


def _optional(check: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    return lambda v: None if v is None else check(v)


def _rank_servers_problem(v: Any) -> str | None:
    if not isinstance(v, dict) or set(v) != {"rule", "world_size"}:
        return 'must be {"rule": ..., "world_size": N}'
    if v["rule"] != RANK_RULE:
        return f"rule={v['rule']!r}; the only rule is {RANK_RULE!r}"
    ok = isinstance(v["world_size"], int) and not isinstance(v["world_size"], bool) and v["world_size"] >= 1
    return None if ok else f"world_size={v['world_size']!r}; must be an int >= 1"


#: field -> (required, check): the check returns why the value is wrong, or None
SCHEMA: dict[str, tuple[bool, Callable[[Any], str | None]]] = {
    "format": (True, lambda v: None if v == FORMAT else f"expected {FORMAT!r} (a foreign file?)"),
    "version": (False, lambda _v: None),  # checked first, on its own (see _check_version)
    "target": (True, lambda v: None if isinstance(v, str) and v.isidentifier() else "must be a target name"),
    "target_ref": (False, _optional(ref_problem)),
    "target_worker_ref": (False, _optional(ref_problem)),
    "impl": (True, _plain_text),
    "impl_ref": (True, ref_problem),
    "impl_kwargs": (False, _optional(_kwargs_problem)),
    "files": (False, _optional(_files_problem)),
    "case": (True, lambda v: None if isinstance(v, (dict, Case)) else "must be an object of Case fields"),
    "case_repr": (False, lambda v: None if isinstance(v, str) else "must be a string"),
    "backend": (True, _one_of(BACKENDS)),
    "device": (True, _one_of(DEVICES)),
    "rank_servers": (False, _optional(_rank_servers_problem)),
    "deterministic": (False, lambda v: None if isinstance(v, bool) else "must be true or false"),
    "kind": (True, _one_of(KINDS)),
    "ratio": (False, lambda v: None if v is None or _is_number(v) else "must be a number or null"),
    "report": (True, lambda v: None if isinstance(v, str) else "must be a string"),
    "trace": (False, _optional(_trace_problem)),
    "inputs_sha256": (
        True,
        lambda v: None if isinstance(v, str) and _HEX64.fullmatch(v) else "must be 64 hex digits",
    ),
    "impl_source_sha256": (False, _sha256_or_null),
    "impl_file_sha256": (False, _sha256_or_null),
    "tolerance": (False, _optional(_tolerance_problem)),
    "numerics": (False, _optional(lambda v: None if isinstance(v, dict) else "must be an object")),
    "versions": (False, _optional(_dict_of_str)),
    "planted": (False, _optional(lambda v: None if isinstance(v, bool) else "must be true or false")),
    "origin": (False, _optional(_dict_of_str)),  # the pytest test and xdist worker that wrote it
    # the finding's signature (shardfuzz.signature): re-keyed on read when of an older version
    "signature": (False, _optional(lambda v: None if isinstance(v, str) else "must be a string")),
    "signature_version": (
        False,
        _optional(lambda v: None if type(v) is int and v >= 1 else "must be an int >= 1"),
    ),
    "site": (False, _optional(lambda v: _site_problem(v, SITE_DEPTH))),
    "writer": (False, _optional(_plain_text)),  # shardfuzz.engine.filewriter: which process wrote it
    "created": (False, _optional(_plain_text)),
    "updated": (False, _optional(_plain_text)),
    "updates": (
        False,
        lambda v: (
            None if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else "must be an int >= 0"
        ),
    ),
}


def _check_version(data: dict[str, Any], where: str) -> int:
    if "version" not in data:
        return 1  # files written before the field existed are version 1
    version = data["version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArgument(f"{where}: field 'version' is {shown(version)}; expected an integer >= 1")
    if version > VERSION:
        raise InvalidArgument(
            f"{where}: format version {version} is newer than this shardfuzz reads ({VERSION}); "
            "upgrade shardfuzz to replay it"
        )
    return version


def validate_failure_record(data: Any, where: str = "failure record") -> dict[str, Any]:
    """Check a failure record (the parsed JSON of a failure file, or a record read from a store of
    findings) against the schema, as a whole, without importing anything. Returns a copy with
    ``version`` filled in and ``case`` as a :class:`~shardfuzz.Case`; InvalidArgument names
    ``where`` and the field otherwise. The trust decision (what the record may import) comes after
    this: :func:`shardfuzz.engine.trust.check_trusted`."""
    if not isinstance(data, dict):
        raise InvalidArgument(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT:
        raise InvalidArgument(
            f"{where}: field 'format' is {shown(data.get('format'))}, expected {FORMAT!r} (a foreign file?)"
        )
    record = dict(data)
    record["version"] = _check_version(data, where)
    for field, (required, check) in SCHEMA.items():
        if field not in data:
            if required:
                raise InvalidArgument(f"{where}: field {field!r} is missing")
            continue
        why = check(data[field])
        if why is not None:
            raise InvalidArgument(f"{where}: field {field!r} is {shown(data[field])}; {why}")
    if data["backend"] == "nccl" and data["device"] != "cuda":  # RunConfig's rule, before anything runs
        raise InvalidArgument(
            f"{where}: field 'device' is {shown(data['device'])} with field 'backend' 'nccl'; nccl runs on "
            "device 'cuda' only (a file written by shardfuzz says so: an edited one)"
        )
    case = data["case"]
    try:
        record["case"] = case if isinstance(case, Case) else Case.from_dict(case)
    except (InvalidArgument, TypeError) as e:
        raise InvalidArgument(f"{where}: field 'case' is invalid: {e}") from None
    if record["case"].target != data["target"]:
        raise InvalidArgument(
            f"{where}: field 'case' is for target {shown(record['case'].target)}, but field 'target' is "
            f"{shown(data['target'])}"
        )
    return record


def load_failure_file(path: str) -> dict[str, Any]:
    """Read a failure file (at most :data:`MAX_FILE_BYTES`) and check it with
    :func:`validate_failure_record`; imports nothing. Errors name the file and the field."""
    where = f"failure file {shown(path)}"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise InvalidArgument(f"{where}: cannot read it: {e.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise InvalidArgument(f"{where}: larger than {MAX_FILE_BYTES} bytes; not a failure file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: '[' * 100000
        raise InvalidArgument(f"{where}: not valid JSON ({printable(str(e))})") from None
    return validate_failure_record(data, where)


def where_of(path: str | None) -> str:
    """How errors name a record's origin."""
    return f"failure file {shown(path)}" if path is not None else "failure record"


__all__ = ["FORMAT", "VERSION", "load_failure_file", "printable", "shown", "validate_failure_record"]
