"""Reading a failure record, in an order that imports nothing untrusted and builds nothing unchecked:

1. the whole record against the schema (:mod:`shardfuzz.engine.failure_schema`): types, known kinds,
   well-formed references, the case's fields;
2. its files found again (a moved checkout: :mod:`shardfuzz.spec.refs`), without importing them;
3. the trust rule (:mod:`shardfuzz.engine.trust`): what the record may make shardfuzz import;
4. only then the target and the implementation are imported: the implementation's arguments are
   checked against its signature (and a planted bug's name against the target's), and the case
   against the target: within the bounds its strategy declares (:mod:`shardfuzz.spec.bounds`),
   then its inputs' size measured before they are built (:mod:`shardfuzz.engine.input_bounds`).

Every error names the file (or the record's origin) and the field.
"""

from __future__ import annotations

import inspect
from typing import Any

from shardfuzz.case import Case
from shardfuzz.engine.config import check_world_size
from shardfuzz.engine.covering import check_option_kinds
from shardfuzz.engine.failure_schema import load_failure_file, shown, validate_failure_record, where_of
from shardfuzz.engine.input_bounds import check_input_size
from shardfuzz.engine.trust import TRUST_FLAG, check_trusted, own_module
from shardfuzz.errors import CaseOutsideBounds, InvalidArgument
from shardfuzz.protocol import ImplRef
from shardfuzz.spec.bounds import check_in_bounds
from shardfuzz.spec.refs import load_ref, ref_of_callable, relocate_ref, split_file_ref
from shardfuzz.spec.registry import BUILTIN_TARGETS, get_target
from shardfuzz.spec.target import Target
from shardfuzz.verdict.oracle import check_case


def load(path: str, *, check: bool = True, trust_refs: bool = False) -> dict[str, Any]:
    """Read and validate a failure file (see the module docstring); ``trust_refs``: import what it
    names even outside the trusted folders (``--trust-refs``)."""
    return prepare(load_failure_file(path), path, check=check, trust_refs=trust_refs)


def prepare(
    data: dict[str, Any], path: str | None, *, check: bool = True, trust_refs: bool = False
) -> dict[str, Any]:
    """Validate a record (steps 1-4 of the module docstring; step 4 only with ``check``). ``path``:
    the file it was read from, None for a record from a store of findings (untrusted: it may name
    only shardfuzz's own and registered code unless ``trust_refs``)."""
    where = where_of(path)
    data = validate_failure_record(data, where)
    for field in ("target_ref", "target_worker_ref", "impl_ref"):
        if isinstance(data.get(field), str):
            data[field] = _field(where, field, relocate_ref, data[field], data.get("files") or {}, field)
    check_trusted(data, path, trust_refs=trust_refs)
    data["path"] = path
    data["impl_spec"] = ImplRef.from_parts(data["impl_ref"], data.get("impl_kwargs") or {})
    case: Case = data["case"]
    _field(where, "case", check_world_size, case.world_size, "world_size")
    if check:
        target, _ = _field(where, "target_ref", record_target, data)
        fn = _field(where, "impl_ref", load_ref, data["impl_ref"], "impl")
        _field(where, "impl_ref", ref_of_callable, data["impl_ref"], "impl")
        _check_kwargs(where, target, data["impl_spec"], fn)
        # before anything is built from it. A hand-edited kind is never stale: checked first, so
        # that a size out of bounds beside it does not set the file aside as stale (NOT RUN)
        _invalid_case(where, check_option_kinds, target, case)
        _invalid_case(where, check_in_bounds, target, case, CaseOutsideBounds)  # stale, not forged
        _field(where, "case", check_input_size, target, case)
        _invalid_case(where, check_case, target, case)
    return data


def _field(where: str, field: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except InvalidArgument as e:
        said = str(e).removeprefix(f"{field}: ")  # a check that names the field itself: once is enough
        raise InvalidArgument(f"{where}: field {field!r}: {said}") from None


def _invalid_case(
    where: str, check: Any, target: Target, case: Case, error: type[InvalidArgument] = InvalidArgument
) -> None:
    try:
        check(target, case)
    except InvalidArgument as e:
        raise error(f"{where}: field 'case' is invalid: {e}") from None


def _check_kwargs(where: str, target: Target, spec: ImplRef, fn: Any) -> None:
    """The implementation must take the rank's ``ctx`` and ``impl_kwargs``; ``bug=NAME`` of the
    target's own reference must name one of its planted bugs (an unknown one would run the
    reference and pass); a built-in target's record may not name another built-in target's code;
    and a function of shardfuzz's own (or a registered package's) code that is no implementation of
    the target is refused, ``--trust-refs`` or not: those packages are trusted to be imported, not
    every function in them to be called with a record's arguments."""
    kwargs = dict(spec.kwargs)
    own = _own_refs(target)
    modules = {r.ref.partition(":")[0] for r in own}
    module = spec.ref.partition(":")[0]
    if target.name in BUILTIN_TARGETS and module.startswith("shardfuzz.targets.") and module not in modules:
        # another built-in target's code on this target's case: it ran, failed, and was reported
        # as this implementation's finding "of a different cause"
        raise InvalidArgument(
            f"{where}: field 'impl_ref': {shown(spec.ref)} is code of another built-in target "
            f"({module}), not of target {target.name!r}, whose implementations are in "
            f"{', '.join(sorted(modules))}"
        )
    bugs = sorted({dict(r.kwargs)["bug"] for r in own if r.ref == spec.ref and "bug" in dict(r.kwargs)})
    if "bug" in kwargs and bugs and kwargs["bug"] not in bugs:
        # the target's implementations bind these bug= values (planted bugs, or a user's own
        # variants that `shardfuzz list` calls no planted bug: the words said "planted bugs")
        raise InvalidArgument(
            f"{where}: field 'impl_kwargs' has bug={shown(kwargs['bug'])}, which no implementation of "
            f"target {target.name!r} binds; they bind bug= {', '.join(bugs)}"
        )
    try:  # an implementation takes the rank's ctx (and the record's keyword arguments)
        inspect.signature(fn).bind(None, **kwargs)
    except TypeError as e:
        what = (
            f"field 'impl_kwargs' is {shown(kwargs)}; the implementation {spec.ref!r} does not take them"
            if kwargs
            else f"field 'impl_ref': {spec.ref!r} is not an implementation: it does not take the rank's ctx"
        )
        raise InvalidArgument(f"{where}: {what} ({e})") from None
    except ValueError:  # no signature to read (a builtin): the call reports it
        pass
    # last, so that the more particular words above come first
    refs = sorted({r.ref for r in own})
    # whatever --trust-refs says: it trusts the code a record names, and a function of those
    # packages called with the record's arguments runs code the record names nowhere as a reference
    # (shardfuzz.spec.registry:_file_targets with path= imports any file: a forged fleet record did,
    # behind a refusal of its target's file alone, which --trust-refs then let through)
    if split_file_ref(spec.ref) is None and own_module(module) and spec.ref not in refs:
        given = f" with impl_kwargs = {shown(kwargs)}" if kwargs else ""
        raise InvalidArgument(
            f"{where}: field 'impl_ref': {shown(spec.ref)}{given} is no implementation of target "
            f"{target.name!r} (its implementations are {', '.join(map(shown, refs)) or 'none'}); a failure "
            "record may name shardfuzz's own or a registered package's code only as one of them, even "
            f"with {TRUST_FLAG}: declare it as one of the target's implementations to run it (docs/trust.md)"
        )


def _own_refs(target: Target) -> list[ImplRef]:
    out = []
    for name in target.implementations:
        try:
            out.append(target.impl_ref(name))
        except InvalidArgument:  # an implementation that cannot be resolved is not this record's
            continue
    return out


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
