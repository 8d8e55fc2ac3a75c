"""Import references for targets and implementations.

Workers run in other processes (forkserver children), so everything they run is passed by
reference and imported there:

* ``"pkg.mod:attr"``: an importable module and an attribute of it;
* ``"path/to/file.py::NAME"``: a file, imported under a stable private module name.

Lambdas, closures and functions defined in ``__main__`` cannot be imported by a worker, so they are
refused with an error that says what to do instead.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any

from shardfuzz.errors import TargetError

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

_FILE_MODULES: dict[str, Any] = {}


def import_file(path: str, what: str) -> Any:
    path = os.path.abspath(path)
    if path in _FILE_MODULES:
        return _FILE_MODULES[path]
    if not os.path.isfile(path):
        raise TargetError(f"{what}: file {path!r} does not exist")
    name = "_shardfuzz_file_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    if name in sys.modules:  # being imported right now (a target file deriving a target at import)
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise TargetError(f"{what}: cannot import {path!r} (not a Python file?)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise TargetError(f"{what}: importing {path!r} raised {type(e).__name__}: {e}") from e
    _FILE_MODULES[path] = module
    return module


def load_ref(ref: str, what: str = "reference") -> Any:
    """Import ``pkg.mod:attr`` or ``file.py::NAME`` and return the object."""
    if not isinstance(ref, str):
        raise TargetError(f"{what}={ref!r}; expected 'pkg.mod:attr' or 'path/file.py::NAME'")
    if "::" in ref:
        path, _, attr = ref.rpartition("::")
        module = import_file(path, what)
    elif ":" in ref:
        modname, _, attr = ref.partition(":")
        try:
            module = importlib.import_module(modname)
        except ImportError as e:
            raise TargetError(f"{what}={ref!r}: cannot import module {modname!r}: {e}") from e
    else:
        raise TargetError(f"{what}={ref!r}; expected 'pkg.mod:attr' or 'path/file.py::NAME'")
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"{what}={ref!r}: {module.__name__!r} has no attribute {attr!r}") from None
    return obj


def _find_spec_fresh(modname: str) -> ModuleSpec | None:
    """The spec a fresh process would find for ``modname``: ask the meta-path finders (path entries,
    editable installs) level by level, ignoring ``sys.modules``."""
    path = None
    spec = None
    parts = modname.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(name, path)
            except (ImportError, ValueError, TypeError):
                spec = None
            if spec is not None:
                break
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec


def _importable(modname: str, file: str | None) -> bool:
    """Whether a fresh process would import ``modname`` from ``file``.

    (``importlib.util.find_spec`` would answer from ``sys.modules``, where pytest's importlib mode
    registers test modules under names no other process can import.)
    """
    if not file or not modname or modname == "__main__":
        return False
    spec = _find_spec_fresh(modname)
    if spec is None or not spec.origin or not os.path.exists(spec.origin):
        return False
    return os.path.samefile(spec.origin, file)


def ref_of_callable(fn: Any, what: str = "impl") -> str:
    """The import reference of a module-level function, or a clear error for ones workers cannot import."""
    if isinstance(fn, str):
        load_ref(fn, what)
        return fn
    if not callable(fn):
        raise TargetError(f"{what}={fn!r} is neither a callable nor a 'pkg.mod:func' reference")
    qual = getattr(fn, "__qualname__", "")
    modname = getattr(fn, "__module__", None)
    if "<lambda>" in qual or "<locals>" in qual or modname in (None, "__main__"):
        raise TargetError(
            f"{what}={fn!r} cannot be imported by worker processes (a lambda, a closure or a function "
            "defined in __main__); define it at module level and pass it, or pass 'pkg.mod:func' or "
            "'path/file.py::NAME'"
        )
    module = sys.modules.get(modname)
    file = getattr(module, "__file__", None)
    if _importable(modname, file):
        ref = f"{modname}:{qual}"
    elif file:
        ref = f"{os.path.abspath(file)}::{qual}"
    else:
        raise TargetError(f"{what}={fn!r}: its module {modname!r} has no file that workers could import")
    return ref


def module_ref(module_globals: dict[str, Any]) -> str | None:
    """Where a module can be re-imported from in a worker: 'modname' or a file path."""
    modname = module_globals.get("__name__")
    file = module_globals.get("__file__")
    if modname and not modname.startswith("_shardfuzz_file_") and _importable(modname, file):
        return modname
    if file:
        return os.path.abspath(file)
    return None
