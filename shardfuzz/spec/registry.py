"""Where targets come from: the built-in ones, those of installed packages (entry-point group
``shardfuzz.targets``), ``pkg.mod:ATTR`` references and ``file.py[::NAME]`` paths."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import pathlib
import re
import sys
from collections.abc import Iterable
from typing import Any

from shardfuzz.errors import TargetError
from shardfuzz.spec.refs import import_file, load_ref, split_file_ref
from shardfuzz.spec.target import Target

# importlib.metadata (~20 ms) is imported where entry points are read: `shardfuzz --help` reads none

ENTRY_POINT_GROUP = "shardfuzz.targets"

#: a built-in target: ``ATTR = Target(`` (or ``ATTR: Target = shardfuzz.Target(``) at the start of a
#: line of ``targets/MODULE.py``, its first argument ``name="NAME"`` (comments before it allowed).
#: tests/test_targets.py checks this reading against Python's parser: a target written otherwise
#: (inside an ``if``, by ``derive``, named positionally) fails that test instead of going missing
_TARGET_STATEMENT = re.compile(
    r"""^([A-Za-z_]\w*)(?:[ \t]*:[ \t]*[\w.]+)?[ \t]*=[ \t]*(?:\w+\.)?Target\((?:\s*#[^\n]*)*\s*name\s*=\s*["'](\w+)["']""",
    re.M,
)


def builtin_targets() -> dict[str, str]:
    """Name -> ``shardfuzz.targets.MODULE:ATTR`` for every target that ``targets/*.py`` defines,
    found by reading the files, not importing them (importing one loads torch: ~1 s), in file
    order. A new built-in target is a new file there: nothing to list by hand."""
    return dict(_builtin_targets())  # a copy: the cached reading is shared


@functools.cache
def _builtin_targets() -> dict[str, str]:
    package = importlib.util.find_spec("shardfuzz.targets")
    folders = package.submodule_search_locations if package is not None else None
    if not folders:
        raise TargetError("the built-in targets' package shardfuzz.targets is not installed")
    return targets_in(folders)


def targets_in(folders: Iterable[str]) -> dict[str, str]:
    """Name -> ``shardfuzz.targets.MODULE:ATTR`` for the targets the files of ``folders`` define."""
    found: dict[str, str] = {}
    for folder in folders:
        for path in sorted(pathlib.Path(folder).glob("*.py")):
            for attr, name in _TARGET_STATEMENT.findall(path.read_text()):
                if name in found:
                    raise TargetError(f"built-in target {name!r} is defined twice: {found[name]} and {path}")
                found[name] = f"shardfuzz.targets.{path.stem}:{attr}"
    return found


def __getattr__(name: str) -> Any:
    if name == "BUILTIN_TARGETS":  # read on first use: `shardfuzz --help` reads no target file
        return builtin_targets()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_targets() -> dict[str, str]:
    """Name -> reference, for built-ins and targets registered by installed packages."""
    found = builtin_targets()  # a copy
    for name, value in _entry_points().items():
        found.setdefault(name, value)
    return found


def registered_ref(name: str) -> str | None:
    """The reference registered under ``name``, or None: a built-in's without reading the entry
    points (~10 ms a call; they cannot shadow a built-in name), else an installed package's."""
    return _builtin_targets().get(name) or _entry_points().get(name)


def get_target(spec: Any) -> Target:
    """A :class:`~shardfuzz.Target` from a Target, a name, ``pkg.mod:ATTR`` or ``file.py[::NAME]``."""
    if isinstance(spec, Target):
        return spec
    if not isinstance(spec, str):
        raise TargetError(
            f"target={spec!r}; expected a Target, a target name, 'pkg.mod:ATTR' or a file.py path"
        )
    parts = split_file_ref(spec)
    if parts is not None:
        return _target_in_file(spec, *parts)
    if ":" in spec:
        modname, _, attr = spec.partition(":")
        try:
            obj = load_ref(spec, "target")
        except TargetError:  # pkg.mod:NAME naming the target rather than its attribute (Target.spec)
            module = sys.modules.get(modname)
            found = vars(module).values() if module is not None else ()
            named = [v for v in found if isinstance(v, Target) and v.name == attr]
            if not named:
                raise
            obj = named[0]
    else:
        ref = registered_ref(spec)
        if ref is None:
            known = ", ".join(sorted(available_targets()))
            raise TargetError(f"target={spec!r} is unknown; known targets: {known}")
        obj = load_ref(ref, f"target {spec!r}")
    if not isinstance(obj, Target):
        raise TargetError(f"target={spec!r} resolves to {obj!r}, not a shardfuzz.Target")
    return obj


def listed_targets(spec: str) -> list[Target]:
    """Every target ``spec`` names: a file without ``::NAME`` lists all it defines (``shardfuzz list
    FILE``; a run needs one of them), anything else the one :func:`get_target` finds."""
    parts = split_file_ref(spec)
    if parts is None or parts[1]:
        return [get_target(spec)]
    _, targets, own = _file_targets(spec, parts[0])
    return own or list(targets.values())


def _file_targets(spec: str, path: str) -> tuple[Any, dict[str, Target], list[Target]]:
    """The module of the file ``path``, its targets by name, and those it defines (not imports)."""
    module = import_file(path, f"target={spec!r}")
    targets = {v.name: v for v in vars(module).values() if isinstance(v, Target)}
    if not targets:
        raise TargetError(f"target={spec!r}: {path!r} defines no shardfuzz.Target")
    # a target the file imports (to derive its own from it) is not one it defines
    own = [t for t in targets.values() if t.origin == getattr(module, "__file__", None)]
    return module, targets, own


def _target_in_file(spec: str, path: str, name: str) -> Target:
    """The target ``name`` (or the only one) that the file ``path`` defines."""
    module, targets, own = _file_targets(spec, path)
    if name:
        if name in targets:
            return targets[name]
        obj = getattr(module, name, None)
        if isinstance(obj, Target):
            return obj
        raise TargetError(f"target={spec!r}: {path!r} has no target {name!r}; it defines {sorted(targets)}")
    if len(own) == 1:
        return own[0]
    if len(targets) > 1:
        # the ones it defines, where it defines several (a target it imports to derive from is not
        # a choice: a new user's file of two derived targets was said to define three)
        names = sorted(t.name for t in own) if len(own) > 1 else sorted(targets)
        raise TargetError(
            f"target={spec!r}: {path!r} defines several targets {names}; add ::NAME, a target's "
            f"name or the module attribute that holds it (e.g. {spec}::{names[0]})"
        )
    return next(iter(targets.values()))


def target_spec(target: Target) -> str:
    """The full reference that finds ``target`` again from any folder, for rerun lines and failure
    files: its registered name for a built-in or entry-point target, else :meth:`Target.spec`
    (``/abs/path/file.py::NAME`` or ``pkg.mod:ATTR``)."""
    ref = registered_ref(target.name)
    if ref is not None:
        try:
            if load_ref(ref, "target") is target:
                return target.name
        except TargetError:
            pass
    return target.spec()


def resolve_worker_target(ref: str) -> Target:
    """Find a target from :meth:`Target.worker_ref` (used inside ranks)."""
    if "::" in ref:
        return get_target(ref)
    modname, _, name = ref.rpartition(":")
    module = importlib.import_module(modname)
    for v in vars(module).values():
        if isinstance(v, Target) and v.name == name:
            return v
    obj = load_ref(ref, "target")
    if isinstance(obj, Target):
        return obj
    raise TargetError(f"target {ref!r} not found in workers")
