"""What code a failure record may make shardfuzz import and run (``docs/trust.md``).

A record names a target and an implementation by reference; replaying it imports them on the driver
and on every rank. The rule, checked before anything is imported:

* shardfuzz's own code (``shardfuzz.*``, the built-in targets and their implementations) and the
  targets of installed packages registered under the ``shardfuzz.targets`` entry point may always
  be named, and imported; but a record's implementation there must be one of its target's own
  (:mod:`shardfuzz.engine.failure_load`; ``--trust-refs`` or not): any other function of those packages that takes the
  rank's ``ctx`` would be called with the record's arguments (``shardfuzz.spec.registry:
  _file_targets`` with ``path=`` imports any file);
* any other code (a ``file.py::NAME`` or a ``pkg.mod:attr`` reference) is imported only when the
  failure file itself *and* that code lie inside a trusted folder: the current project root (the
  nearest folder above the current one holding ``pyproject.toml``, ``setup.cfg``, ``setup.py`` or
  ``.git``, else the current folder) or a folder of the search path (``--search-path``,
  ``$SHARDFUZZ_PATH``). A record read from a store of findings has no such folder: it may name
  only the code of the first point;
* anything else is refused with a message naming what would be imported and ``--trust-refs``
  (``regressions(trust_refs=True)``, ``trust_refs=True``), the explicit choice to run it.
"""

from __future__ import annotations

import os
from typing import Any

from shardfuzz.engine.failure_schema import shown
from shardfuzz.errors import InvalidArgument
from shardfuzz.spec.refs import current_project_root, find_module_spec, search_path, split_file_ref
from shardfuzz.spec.registry import available_targets, builtin_targets, registered_ref

TRUST_FLAG = "--trust-refs"


def add_trust_option(parser: Any) -> None:
    """Give an argparse parser ``--trust-refs`` (``args.trust_refs``)."""
    parser.add_argument(
        TRUST_FLAG,
        action="store_true",
        help="import and run the code a failure file names even outside the current project and the "
        "search path (read that code first: see docs/trust.md)",
    )


def trusted_folders() -> list[str]:
    """The current project root, then the search path's folders (real paths)."""
    here = current_project_root()
    return [os.path.realpath(d) for d in ([here] if here else []) + search_path()]


def inside(path: str, folders: list[str]) -> bool:
    """Whether ``path`` (symbolic links and ``..`` resolved) lies in one of ``folders``."""
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d.rstrip(os.sep) + os.sep) for d in folders)


def _registered_packages() -> set[str]:
    """Top-level packages of the targets installed packages register (entry points)."""
    builtin = builtin_targets()
    registered = [ref for name, ref in available_targets().items() if name not in builtin]
    return {ref.partition(":")[0].split(".")[0] for ref in registered}


def own_module(modname: str) -> bool:
    """Whether ``modname`` is shardfuzz's own code or a registered package's (always importable)."""
    top = modname.split(".")[0]
    return top == "shardfuzz" or top in _registered_packages()


def _code_of(ref: str) -> tuple[bool, str | None, str]:
    """(whether it is shardfuzz's own or registered code, the file the reference would import, how
    to name it)."""
    parts = split_file_ref(ref)
    if parts is not None:
        return False, parts[0], f"the file {shown(parts[0])}"
    if ":" not in ref:  # a registered target's name
        known = registered_ref(ref)
        return (True, None, "") if known is None else _code_of(known)
    modname = ref.partition(":")[0]
    if own_module(modname):
        return True, None, ""
    # found without importing anything; a missing submodule still imports its parent package
    spec = find_module_spec(modname) or find_module_spec(modname.split(".")[0])
    if spec is None:
        return True, None, ""  # nothing can be imported: the import itself reports it
    origin = spec.origin if spec.origin and os.path.exists(spec.origin) else None
    return False, origin, f"the module {shown(modname)}" + (f" ({shown(origin)})" if origin else "")


def check_trusted(record: dict[str, Any], source: str | None, *, trust_refs: bool = False) -> None:
    """InvalidArgument unless every reference of ``record`` (read from the failure file ``source``;
    None: from a store of findings) may be imported under the rule above. Imports nothing."""
    if trust_refs:
        return
    where = f"failure file {shown(source)}" if source is not None else "failure record"
    folders = trusted_folders()
    record_trusted = source is not None and inside(source, folders)
    refused = []  # every field the user would trust with --trust-refs, not only the first
    why = ""
    for field in ("target_ref", "target_worker_ref", "impl_ref"):
        ref = record.get(field)
        if not isinstance(ref, str):
            continue
        own, code, what = _code_of(ref)
        if own or (record_trusted and code is not None and inside(code, folders)):
            continue
        refused.append(f"field {field!r} = {shown(ref)} would import and run {what}")
        if not record_trusted:
            why = (
                "the failure file is outside the current project and the search path"
                if source is not None
                else "a record from a store of findings"
            )
            why += ", so it may name only shardfuzz's own and registered targets and implementations"
        elif code is not None and os.path.realpath(code) != os.path.abspath(code):  # a link: where to
            why = (
                f"that code is a link to {shown(os.path.realpath(code))}, outside the current project "
                "and the search path"
            )
        else:
            why = why or "that code is outside the current project and the search path"
    if not refused:
        return
    kwargs = record.get("impl_kwargs")
    # what --trust-refs would pass the implementation too (a forged record hid a file to import in
    # the arguments of an implementation of shardfuzz's own, behind a refusal of its target alone)
    given = f"; the implementation would be called with impl_kwargs = {shown(kwargs)}" if kwargs else ""
    fix = (
        "put the failure file and the code in your project or a folder of --search-path / $SHARDFUZZ_PATH"
        if source is not None
        else "a record from a store names no folder to trust: only that flag runs it"
    )
    raise InvalidArgument(
        f"{where}: {'; '.join(refused)}{given}; {why} "
        f"(trusted folders: {', '.join(map(repr, folders)) or 'none'}). Read that code first; then "
        f"pass {TRUST_FLAG} (regressions(trust_refs=True)) to run it, or {fix}"
    )
