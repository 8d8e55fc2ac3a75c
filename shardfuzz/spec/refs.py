"""Import references for targets and implementations.

Workers run in other processes (forkserver children), so everything they run is passed by
reference and imported there:

* ``"pkg.mod:attr"``: an importable module and an attribute of it;
* ``"path/to/file.py::NAME"``: a file, imported under a stable private module name.

Lambdas, closures and functions defined in ``__main__`` cannot be imported by a worker, so they are
refused with an error that says what to do instead.

File paths are made absolute when a reference is taken, so a reference works from any folder.
Failure files also keep each file's path relative to its *project root* (the nearest folder above
it holding ``pyproject.toml``, ``setup.cfg``, ``setup.py`` or ``.git``; else the current folder when
the file is under it; else the file's own folder). A path that does not exist is looked up, in
order, relative to the current folder, the current project root, and each folder of the search
path: ``add_search_path`` (``shardfuzz --search-path DIR``) and ``$SHARDFUZZ_PATH``
(``os.pathsep``-separated). That is how a failure file keeps working after its checkout moved.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import traceback
import types
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from shardfuzz.errors import TargetError

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec

_FILE_MODULES: dict[str, Any] = {}
PROJECT_MARKERS = ("pyproject.toml", "setup.cfg", "setup.py", ".git")
SEARCH_PATH_ENV = "SHARDFUZZ_PATH"
_search_path: list[str] = []  # added by add_search_path (--search-path)


def add_search_path(dirs: Any) -> None:
    """Add folders where moved files are looked up (``--search-path DIR``, repeatable)."""
    for d in [dirs] if isinstance(dirs, str) else list(dirs):
        if not isinstance(d, str) or not os.path.isdir(d):
            raise TargetError(f"--search-path={d!r} is not a directory; give the folder of a checkout")
        if _abspath(d) not in _search_path:
            _search_path.append(_abspath(d))


def add_search_path_option(parser: Any) -> None:
    """Give an argparse parser the repeatable ``--search-path DIR`` option (``args.search_path``)."""
    parser.add_argument(
        "--search-path",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder where the files of a moved checkout are looked up (repeatable; also $SHARDFUZZ_PATH)",
    )


def search_path() -> list[str]:
    """The folders where moved files are looked up: ``add_search_path``'s, then ``$SHARDFUZZ_PATH``'s."""
    env = [d for d in os.environ.get(SEARCH_PATH_ENV, "").split(os.pathsep) if d.strip()]
    for d in env:
        if not os.path.isdir(d):
            raise TargetError(
                f"environment variable {SEARCH_PATH_ENV} holds {d!r}, which is not a directory; it "
                f"takes folders separated by {os.pathsep!r}"
            )
    return [*_search_path, *(_abspath(d) for d in env)]


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except FileNotFoundError:  # the current folder was deleted (a checkout that moved)
        return None


def _abspath(path: str) -> str:
    cwd = _cwd()
    return os.path.normpath(os.path.join(cwd, path)) if cwd and not os.path.isabs(path) else path


def _marked_root(path: str) -> str | None:
    d = path if os.path.isdir(path) else os.path.dirname(path)
    while True:
        if any(os.path.exists(os.path.join(d, m)) for m in PROJECT_MARKERS):
            return d
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def current_project_root() -> str | None:
    """The project root of the current folder (the marked folder above it, else the folder itself);
    None when the current folder was deleted."""
    cwd = _cwd()
    return (_marked_root(cwd) or cwd) if cwd else None


def project_root(path: str) -> str:
    """The project root of a file (see the module docstring)."""
    path = _abspath(path)
    root = _marked_root(path)
    if root is not None:
        return root
    cwd = _cwd()
    return cwd if cwd and path.startswith(cwd.rstrip(os.sep) + os.sep) else os.path.dirname(path)


def project_relative(path: str) -> str:
    """``path`` relative to its project root (what a failure file keeps beside the absolute path)."""
    path = _abspath(path)
    return os.path.relpath(path, project_root(path))


def resolve_file(path: str, what: str, relative: str | None = None) -> str:
    """The absolute path of an existing file: ``path`` as given (absolute, or relative to the current
    folder), else ``relative`` (or a relative ``path``) under the current project root and each folder
    of the search path. TargetError names what was tried."""
    if not isinstance(path, str) or not path:
        raise TargetError(f"{what}: file path {path!r}; expected a path to a .py file")
    first = _abspath(path)
    if os.path.isabs(first) and os.path.isfile(first):
        return first
    rels = [r for r in (relative, None if os.path.isabs(path) else path) if r]
    cwd = _cwd()
    here = _marked_root(cwd) if cwd else None
    # the current folder first, as the module says (it was tried only as a project root's, so a
    # colleague's folder without pyproject.toml or .git never found the file beside them)
    bases = list(dict.fromkeys([b for b in (cwd, here) if b] + search_path()))
    tried = [first]
    for base in bases:
        for rel in rels:
            candidate = os.path.normpath(os.path.join(base, rel))
            if os.path.isfile(candidate):
                return candidate
            tried.append(candidate)
    hint = (
        "; if its checkout moved, set SHARDFUZZ_PATH (or the command's --search-path DIR) to the new folder"
    )
    tried_text = ", ".join(repr(t) for t in dict.fromkeys(tried))
    raise TargetError(f"{what}: file {path!r} does not exist (looked for {tried_text}){hint}")


def split_file_ref(ref: str) -> tuple[str, str] | None:
    """``("path/file.py", "NAME")`` for a ``file.py::NAME`` reference (``NAME`` may be ""), ``("file.py",
    "")`` for a bare ``.py`` path, None for anything else."""
    if not isinstance(ref, str):
        return None
    if "::" in ref:
        path, _, attr = ref.rpartition("::")
        return path, attr
    if ref.endswith(".py"):
        return ref, ""
    return None


def _join_file_ref(path: str, attr: str) -> str:
    return f"{path}::{attr}" if attr else path


def absolute_ref(ref: str, what: str = "reference", relative: str | None = None) -> str:
    """A ``file.py[::NAME]`` reference with its file resolved to an absolute path (others unchanged)."""
    parts = split_file_ref(ref)
    if parts is None:
        return ref
    return _join_file_ref(resolve_file(parts[0], what, relative), parts[1])


def anchored_ref(ref: Any, base_dir: str) -> Any:
    """A relative ``file.py[::NAME]`` reference made absolute against ``base_dir`` when the file is
    there (``test_for`` anchors at the calling test file's folder); anything else unchanged."""
    parts = split_file_ref(ref)
    if parts is None or os.path.isabs(parts[0]):
        return ref
    candidate = os.path.join(base_dir, parts[0])
    return _join_file_ref(os.path.normpath(candidate), parts[1]) if os.path.isfile(candidate) else ref


def caller_dir(depth: int = 2) -> str:
    """The folder of the file ``depth`` frames up (1: the caller's; 2, the default: its caller's),
    where relative ``file.py`` references given to ``test_for`` and the testing helpers start."""
    file = sys._getframe(depth).f_globals.get("__file__")
    return os.path.dirname(os.path.abspath(file)) if file else os.getcwd()


def file_entries(refs: Any) -> dict[str, str]:
    """``{absolute path: path relative to its project root}`` for the files the references name
    (failure files keep it, to find the files again after a checkout moved)."""
    out: dict[str, str] = {}
    for ref in refs:
        parts = split_file_ref(ref)
        if parts is not None and os.path.isabs(parts[0]):
            out[parts[0]] = project_relative(parts[0])
    return out


def relocate_ref(ref: str, files: Any, what: str) -> str:
    """A recorded reference, its file found again: at its absolute path, else by the path relative
    to its project root that ``files`` (see :func:`file_entries`) kept."""
    parts = split_file_ref(ref)
    if parts is None:
        return ref
    relative = files.get(parts[0]) if isinstance(files, dict) else None
    return absolute_ref(ref, what, relative if isinstance(relative, str) else None)


def import_file(path: str, what: str) -> Any:
    path = resolve_file(path, what)
    if path in _FILE_MODULES:
        return _FILE_MODULES[path]
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
        raise TargetError(
            f"{what}: importing {path!r} raised {type(e).__name__}: {e}{_where(e)}{_beside(e, path)}"
        ) from e
    _FILE_MODULES[path] = module
    return module


def _where(error: Exception) -> str:
    """The line that raised, in the user's code: the innermost frame outside the import machinery
    (a NameError at a target file's top level was reported with no line; a SyntaxError names its
    own)."""
    if isinstance(error, SyntaxError):
        return ""
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not f.filename.startswith("<frozen") and "importlib" not in f.filename and f.filename != __file__
    ]
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno}" + (f": {f.line.strip()}" if f.line else "") + ")"


#: folders above a target file looked at for the module it could not import (a package at the
#: project's root, a target file in tests/)
ABOVE = 4


def _beside(error: Exception, path: str) -> str:
    """What to do when a file imports a module that sits beside it, or in a folder above it (the
    project's own package, the file in ``tests/``): a file is imported by path, so its folder is
    not on the import path (in the ranks neither), as for any module but a script; and pytest puts
    a test file's folder there, not the project's root (a new user's ``mylib`` did not import)."""
    missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
    top = missing.split(".")[0] if missing else ""
    folder = os.path.dirname(os.path.abspath(path))
    for depth in range(ABOVE + 1):
        if top and (
            os.path.isfile(os.path.join(folder, top + ".py")) or os.path.isdir(os.path.join(folder, top))
        ):
            where = "beside the file" if depth == 0 else "in a folder above the file"
            return (
                f" ({top!r} is {where}, in {folder!r}, which is not on the import path: run with "
                f"PYTHONPATH={shlex.quote(folder)} (under pytest: its pythonpath setting), or install "
                "the package it belongs to)"
            )
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return ""


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
        except Exception as e:
            raise TargetError(
                f"{what}={ref!r}: importing {modname!r} raised {type(e).__name__}: {e}{_where(e)}"
            ) from e
    else:
        raise TargetError(f"{what}={ref!r}; expected 'pkg.mod:attr' or 'path/file.py::NAME'")
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = getattr(module, "__file__", None) if "::" in ref else None
            raise TargetError(
                f"{what}={ref!r}: {where or module.__name__!r} has no attribute {attr!r}"
            ) from None
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


def find_module_spec(modname: str) -> ModuleSpec | None:
    """The spec a fresh process would find for ``modname``, found without importing anything."""
    return _find_spec_fresh(modname)


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
        obj = load_ref(fn, what)
        if not callable(obj):
            raise TargetError(
                f"{what}={fn!r} is a {type(obj).__name__}, not a function; an implementation is a "
                "module-level function called as impl(ctx) on every rank"
            )
        return absolute_ref(fn, what)
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
        raise TargetError(
            f"{what}={fn!r}: its module {modname!r} has no file that workers could import (a module "
            "loaded by hand, not in sys.modules); load a target file with "
            "shardfuzz.get_target('path/file.py') to derive from it, or pass 'path/file.py::NAME'"
        )
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


# -- what a rerun in a fresh process must add to its import path ---------------------------------
@functools.lru_cache(maxsize=1)
def _fresh_import_path() -> frozenset[str]:
    """The import path a fresh interpreter of this Python starts with here in a new shell (.pth
    files and installed packages included, not this shell's $PYTHONPATH: a rerun line pasted
    elsewhere failed to import a module that only $PYTHONPATH had found), read once from one."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import sys; print('\\n'.join(sys.path))"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    except (OSError, subprocess.SubprocessError):
        out = None
    if out is None or out.returncode != 0:  # no answer: every folder counts as a fresh one's, and
        return frozenset(
            os.path.abspath(p or ".") for p in sys.path if isinstance(p, str)
        )  # the line stays bare
    return frozenset(os.path.abspath(p) for p in out.stdout.splitlines() if p)


def import_path_for(refs: Iterable[str]) -> list[str]:
    """The folders of this process's import path that the modules ``refs`` name (``file.py::NAME``,
    ``pkg.mod:attr``) import from, and that a fresh ``shardfuzz`` process would not have: pytest
    puts a test's root folder on the path, a script its own folder, and a ``shardfuzz case`` rerun
    line printed there failed to import the helper module a target file imports. Read from what
    the files bind at their top level (modules, and functions and classes imported from them);
    empty for code that is installed. A folder on ``$PYTHONPATH`` counts: the line must run in a
    shell without it."""
    prefixes = tuple(os.path.join(os.path.abspath(p), "") for p in {sys.prefix, sys.base_prefix})
    tops = {
        top
        for top in _imported_tops(_modules_of(refs)) - set(sys.stdlib_module_names) - {"shardfuzz"}
        if not (getattr(sys.modules.get(top), "__file__", None) or "").startswith(prefixes)  # installed
    }
    if not tops:  # nothing of the user's own: no fresh interpreter to ask
        return []
    fresh = _fresh_import_path()
    entries = [os.path.abspath(p or ".") for p in sys.path if isinstance(p, str)]
    candidates = [p for p in dict.fromkeys(entries) if p not in fresh and os.path.isdir(p)]
    needed = set()
    for top in tops:
        homes = [h for h in _homes(sys.modules.get(top)) if h in candidates]
        if homes and not _installed_elsewhere(top, candidates):
            needed.update(homes)
    return [p for p in candidates if p in needed]


def pythonpath_prefix(refs: Iterable[str]) -> str:
    """``PYTHONPATH=... `` for a command printed to run elsewhere (a rerun line, a replay or
    torchrun command), where the modules ``refs`` name import from folders only this process has
    on its import path (:func:`import_path_for`); else nothing."""
    try:
        folders = import_path_for(refs)
        inherited = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    except Exception:  # noqa: BLE001 (advice on a printed command must never fail a run: a bare line)
        return ""
    if not folders:
        return ""
    return f"PYTHONPATH={shlex.quote(os.pathsep.join(dict.fromkeys([*folders, *inherited])))} "


def _homes(module: Any) -> list[str]:
    """The import-path folders a top-level module was found in: a file's folder, a package's
    parent, each parent of a namespace package's paths."""
    where = getattr(module, "__file__", None)
    if isinstance(where, str):
        folder = os.path.dirname(os.path.abspath(where))
        return [os.path.dirname(folder) if os.path.basename(where).startswith("__init__.") else folder]
    return [os.path.dirname(os.path.abspath(p)) for p in getattr(module, "__path__", None) or []]


def _modules_of(refs: Iterable[str]) -> list[Any]:
    """The imported modules that references name (a file's, a package module's)."""
    modules = []
    for ref in refs:
        parts = split_file_ref(ref)
        if parts is not None:
            modules.append(
                _FILE_MODULES.get(_abspath(parts[0])) or _FILE_MODULES.get(os.path.abspath(parts[0]))
            )
        elif re.fullmatch(r"[\w.]+:[\w.]+", ref):
            modules.append(sys.modules.get(ref.partition(":")[0]))
    return [m for m in modules if m is not None]


def _imported_tops(modules: list[Any]) -> set[str]:
    """The top-level names of the modules, and of what each imports (what ``import x`` and ``from
    x import f, C`` bind: modules, functions, classes), files imported by path left out."""
    names = [m.__name__ for m in modules]
    for m in modules:
        for value in vars(m).values():
            if isinstance(value, types.ModuleType):
                names.append(value.__name__)
            elif isinstance(value, (type, types.FunctionType)):  # a plain attribute of theirs
                names.append(value.__module__)
    return {n.split(".")[0] for n in names if isinstance(n, str) and not n.startswith("_shardfuzz_file_")}


def _installed_elsewhere(top: str, candidates: list[str]) -> bool:
    """Whether ``top`` imports without the folders ``candidates`` (an editable install's finder,
    a .pth entry): then no rerun needs them for it. A finder's answer from one of those folders
    does not count (pytest's assertion rewriter searches the whole path)."""
    for finder in sys.meta_path:
        if isinstance(finder, type) and issubclass(finder, importlib.machinery.PathFinder):
            rest = [p for p in sys.path if isinstance(p, str) and os.path.abspath(p or ".") not in candidates]
            spec = importlib.machinery.PathFinder.find_spec(top, rest)
        else:
            try:
                find = getattr(finder, "find_spec", None)
                spec = find(top, None) if find is not None else None
            except (ImportError, ValueError, AttributeError, TypeError):  # a finder that cannot say
                continue
        places = [getattr(spec, "origin", None), *(getattr(spec, "submodule_search_locations", None) or [])]
        found = [os.path.abspath(p) for p in places if isinstance(p, str) and os.path.isabs(p)]
        if spec is not None and not any(f.startswith(os.path.join(c, "")) for f in found for c in candidates):
            return True
    return False
