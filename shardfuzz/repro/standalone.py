"""Reproducers to file upstream: ``shardfuzz repro FILE --standalone -o DIR`` writes a script that
needs nothing but torch.

The script carries the case's inputs (inlined, or ``SCRIPT.pt`` beside it when large), the
implementation's source with what it uses from its own module (shardfuzz's ``Unsupported`` and
constants are inlined, other shardfuzz code is copied from its module), the oracle's float64
values with the tolerance the engine allowed, and a ``ctx`` cut down to this case. It runs under
``torchrun --nproc-per-node=N``; each rank compares its outputs and fails with the worst element,
or raises what the implementation raises.
"""

from __future__ import annotations

import ast
import datetime
import functools
import importlib
import inspect
import keyword
import os
import pprint
import re
import sys
import textwrap
from typing import Any

import torch

import shardfuzz
from shardfuzz.engine.failures import record_impl, record_target
from shardfuzz.engine.runner import Runner
from shardfuzz.errors import InvalidArgument, Unsupported
from shardfuzz.repro.codegen import check_script, docstring, fill_template, uses_float_names
from shardfuzz.repro.replay import record_config
from shardfuzz.repro.standalone_script import CTX_USES, DOC, HARNESS_IMPORTS, harness_names, harness_template
from shardfuzz.spec.layouts import Layout, Owned, PaddedFlat, Partial, Replicate, Shard, strided_view
from shardfuzz.spec.placements import AsDTensor, FromDTensor
from shardfuzz.spec.refs import load_ref, split_file_ref
from shardfuzz.verdict.decide import FLIP_PROBE
from shardfuzz.verdict.oracle import confirm_noise, estimate_noise, search_flips, widen_full_scale

#: larger tensors go to ``SCRIPT.pt`` beside the script (``repro_x.pt`` for ``repro_x.py``)
INLINE_NUMEL = 512


#: the longest script name (before "_N.py"): a 990-character implementation name made the file
#: system refuse the script (ENAMETOOLONG)
STEM_LIMIT = 120


@functools.cache
def _parsed(module_name: str) -> tuple[str, ast.Module]:
    """A module's source and its parse, once per module (every copied name looks it up)."""
    src = inspect.getsource(sys.modules[module_name])
    return src, ast.parse(src)


class _Closure:
    """The source an implementation needs, in dependency order: imports, constants, definitions."""

    def __init__(self) -> None:
        self.imports: list[str] = []
        self.defs: list[str] = []
        self.seen: set[tuple[str, str]] = set()
        self.shims: set[str] = set()

    def defined(self) -> list[str]:
        """The module-level names the copied code defines."""
        tree = ast.parse("\n\n".join(self.defs))
        return [
            name
            for node in tree.body
            for name in (
                [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else _assigned(node)
            )
        ]

    def add_object(self, obj: Any, name: str) -> None:
        module = sys.modules[obj.__module__]
        if (module.__name__, name) in self.seen:
            return
        self.seen.add((module.__name__, name))
        tree = _parsed(module.__name__)[1]
        node = next(n for n in tree.body if getattr(n, "name", None) == name)
        self._add_node(module, tree, node)

    def _add_node(self, module: Any, tree: ast.Module, node: ast.stmt) -> None:
        src = _parsed(module.__name__)[0]
        lines = ast.get_source_segment(src, node, padded=True) or ""
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.decorator_list:
            first = node.decorator_list[0].lineno
            lines = "\n".join(src.splitlines()[first - 1 : node.end_lineno])
        drop: list[tuple[int, int]] = []
        for inner in ast.walk(node):  # shardfuzz imports inside a function: resolved here instead
            if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("shardfuzz"):
                drop.append((inner.lineno, inner.end_lineno or inner.lineno))
                for alias in inner.names:
                    self._resolve(importlib.import_module(str(inner.module)), alias.name, alias.asname)
        decorators = getattr(node, "decorator_list", None)
        start = decorators[0].lineno if decorators else node.lineno
        text = lines.splitlines()
        # `import shardfuzz` and then `shardfuzz.Unsupported(...)` (the target spec's way): each
        # `shardfuzz.NAME` resolved as `from shardfuzz import NAME` is, and written as plain NAME
        carried = self._carry_attributes(module, tree, node)
        for lineno, col, end_col, name in sorted(carried, reverse=True):
            row = text[lineno - start].encode()  # the AST's columns count UTF-8 bytes
            text[lineno - start] = (row[:col] + name.encode() + row[end_col:]).decode()
        kept = [line for i, line in enumerate(text, start) if not any(a <= i <= b for a, b in drop)]
        through = {id(n) for n in carried.values()}  # those name nodes are written out
        for name in _names_used(node, skip=through):
            self._use(module, tree, name)
        self.defs.append(textwrap.dedent("\n".join(kept)))

    def _carry_attributes(
        self, module: Any, tree: ast.Module, node: ast.stmt
    ) -> dict[tuple[int, int, int, str], ast.Name]:
        """The ``shardfuzz.NAME`` uses in ``node`` of a module-level ``import shardfuzz`` (or of one
        of its modules, under any alias), each resolved: (line, start, end column, NAME) -> the
        ``shardfuzz`` name node it reads through."""
        aliases = {
            # `import shardfuzz.x as y` binds y to shardfuzz.x; `import shardfuzz.x` binds shardfuzz
            alias.asname or alias.name.split(".")[0]: alias.name if alias.asname else alias.name.split(".")[0]
            for n in tree.body
            if isinstance(n, ast.Import)
            for alias in n.names
            if alias.name.split(".")[0] == "shardfuzz"
        }
        carried: dict[tuple[int, int, int, str], ast.Name] = {}
        for inner in ast.walk(node):
            if not (
                isinstance(inner, ast.Attribute)
                and isinstance(inner.value, ast.Name)
                and inner.value.id in aliases
                and inner.end_lineno == inner.lineno
            ):
                continue
            owner = importlib.import_module(aliases[inner.value.id])
            obj = getattr(owner, inner.attr, None)
            if obj is None and not hasattr(owner, inner.attr):
                raise InvalidArgument(
                    f"the implementation uses {owner.__name__}.{inner.attr}, which does not exist"
                )
            if inspect.ismodule(obj):
                raise InvalidArgument(
                    f"the implementation uses the module {obj.__name__} (line {inner.lineno} of "
                    f"{module.__name__}); a standalone script carries names taken from shardfuzz "
                    f"(from {obj.__name__} import NAME, or {inner.value.id}.NAME)"
                )
            self._resolve(owner, inner.attr, None)
            carried[(inner.lineno, inner.col_offset, inner.end_col_offset or 0, inner.attr)] = inner.value
        return carried

    def _use(self, module: Any, tree: ast.Module, name: str) -> None:
        for n in tree.body:
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                for alias in n.names:
                    bound = alias.asname or alias.name.split(".")[0]
                    if bound != name:
                        continue
                    if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("shardfuzz"):
                        self._resolve(importlib.import_module(str(n.module)), alias.name, alias.asname)
                    elif isinstance(n, ast.Import) and alias.name.startswith("shardfuzz"):
                        raise InvalidArgument(
                            f"the implementation uses the module {alias.name!r} itself (as {bound!r}, not "
                            f"only {bound}.NAME); a standalone script carries names taken from shardfuzz: "
                            f"from {alias.name} import NAME, or {bound}.NAME"
                        )
                    elif isinstance(n, ast.ImportFrom) and n.module == "__future__":
                        pass
                    else:
                        line = ast.unparse(
                            ast.ImportFrom(n.module, [alias], n.level)
                            if isinstance(n, ast.ImportFrom)
                            else ast.Import([alias])
                        )
                        if line not in self.imports:
                            self.imports.append(line)
                    return
            names = [n.name] if isinstance(n, (ast.FunctionDef, ast.ClassDef)) else _assigned(n)
            if name in names and (module.__name__, name) not in self.seen:
                # every name the statement binds: `LR, B1 = ...` is copied once, not once a name
                self.seen.update((module.__name__, bound) for bound in names)
                self._add_node(module, tree, n)
                return

    def _resolve(self, module: Any, name: str, asname: str | None) -> None:
        """A name imported from shardfuzz: a shim, a constant, or its source copied."""
        obj = getattr(module, name)
        bound = asname or name
        if isinstance(obj, type) and issubclass(obj, Unsupported):
            self.shims.add("Unsupported")
        elif obj is None or isinstance(obj, (bool, int, float, str, tuple)):
            line = f"{bound} = {obj!r}"
            if line not in self.defs:
                self.defs.append(line)
        elif inspect.isfunction(obj) or inspect.isclass(obj):
            if bound != obj.__name__:
                raise InvalidArgument(f"the implementation imports {name!r} as {asname!r}")
            self.add_object(obj, obj.__name__)
        else:
            raise InvalidArgument(
                f"the implementation uses {module.__name__}.{name} ({type(obj).__name__}), which a "
                "standalone script cannot carry"
            )


def _assigned(node: ast.stmt) -> list[str]:
    """The names an assignment binds, unpacked ones included (``OPS, SKIPPED = generate()``)."""
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    names: list[str] = []
    for t in targets:
        names += [
            e.id for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]) if isinstance(e, ast.Name)
        ]
    return names


def _names_used(node: ast.AST, skip: frozenset[int] | set[int] = frozenset()) -> list[str]:
    """The names ``node`` reads, but for the name nodes in ``skip`` (by id)."""
    out: list[str] = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in out and id(n) not in skip:
            out.append(n.id)
    return out


def _layout_spec(layout: Layout, name: str, what: str = "output") -> tuple:
    """A layout as a literal the script reads (``what``: an ``output`` or an ``input``)."""
    if what == "input" and isinstance(layout, AsDTensor):  # handed over as a DTensor, as the ranks did
        return ("dtensor", tuple(_placement_spec(p, name, layout) for p in layout.placements), layout.mesh)
    if isinstance(layout, Replicate):
        return ("replicate",)
    if isinstance(layout, Partial):
        return ("partial",)
    if isinstance(layout, Shard):  # a fused dim (blocks > 1) says so: the script splits each block
        return ("shard", layout.dim, layout.rule) + ((layout.blocks,) if layout.blocks != 1 else ())
    if type(layout) is PaddedFlat:  # ZeRO's flat buffers (a subclass may lay values out otherwise)
        return ("padded_flat",)
    if isinstance(layout, FromDTensor):  # the script compares the DTensor's full_tensor()
        return ("dtensor",)
    if what == "output" and isinstance(layout, Owned) and layout.rank is not None:
        return ("owned", layout.rank)  # the owner compares the whole value, the others hold (0,)
    raise InvalidArgument(
        f"{what} {name!r} has layout {layout!r}; a standalone script handles Replicate, Shard, Partial, "
        + (
            "PaddedFlat, FromDTensor and Owned(rank=...) (the owner named: Owned() is found only by "
            "asking every rank)"
            if what == "output"
            else "PaddedFlat and AsDTensor of Shard and Replicate"
        )
    )


def _placement_spec(placement: Any, name: str, layout: Layout) -> tuple:
    """One of torch's placements of an ``AsDTensor`` input: Shard(dim) or Replicate()."""
    kind = type(placement).__name__
    if kind == "Shard":
        return ("shard", int(placement.dim))
    if kind == "Replicate":
        return ("replicate",)
    raise InvalidArgument(
        f"input {name!r} has layout {layout!r}; a standalone script hands inputs over as DTensors "
        f"with Shard and Replicate placements, not {placement!r}"
    )


def _tensor_literal(t: Any) -> str:
    if not isinstance(t, torch.Tensor):
        return repr(t)
    values = t.tolist() if t.dtype != torch.bfloat16 else t.float().tolist()
    return f"torch.tensor({values!r}, dtype=torch.{str(t.dtype).split('.')[-1]})"


def _tensors(values: dict[str, Any], key: str, saved: dict[str, Any]) -> str:
    items = []
    for name, v in values.items():
        if isinstance(v, torch.Tensor) and v.numel() > INLINE_NUMEL:
            saved[f"{key}.{name}"] = v
            items.append(f"    {name!r}: DATA[{key + '.' + name!r}],")
        else:
            items.append(f"    {name!r}: {_tensor_literal(v)},")
    return "{\n" + "\n".join(items) + "\n}"


def write_standalone(record: dict[str, Any], directory: str) -> str:
    """Write ``DIR/repro_<target>_<impl>.py`` (``_2``, ``_3``... where that name is taken; and the same name ``.pt`` when needed) for one failure
    record; returns the script's path."""
    target, _ = record_target(record)
    case = record["case"]
    runner = Runner(target, record_impl(target, record), record_config(record))
    ref = runner.impl_ref
    in_file = split_file_ref(ref.ref)  # file.py::NAME, the README's way: its module is the file
    fname = in_file[1] if in_file is not None else ref.ref.partition(":")[2]
    if not fname:
        raise InvalidArgument(
            f"impl {ref.ref!r}: a standalone script needs 'pkg.mod:func' or 'file.py::func'"
        )
    if not fname.isidentifier() or keyword.iskeyword(fname):  # the script calls it by this name
        raise InvalidArgument(f"impl {ref.ref!r}: {fname!r} is not a function's name")
    fn = load_ref(ref.ref, "impl")
    closure = _Closure()
    closure.add_object(fn, fname)
    uses = {part: use in "\n\n\n".join(closure.defs) for part, use in CTX_USES.items()}
    # a case with strided=True hands the layout-free inputs over as views, as the ranks did
    strided = tuple(target.layout_free) if case.options.get("strided") and uses["ctx.local"] else ()
    if strided:
        closure.add_object(strided_view, "strided_view")
    code = "\n\n\n".join(closure.defs)
    clash = sorted(set(closure.defined()) & harness_names())
    if clash:  # the harness's own definition would replace the implementation's, silently
        raise InvalidArgument(
            f"impl {ref.ref!r}: its code defines {', '.join(map(repr, clash))}, which the standalone "
            f"script's harness defines too (it defines {', '.join(sorted(harness_names()))}); rename them"
        )
    expected = runner.expected(case)
    if expected.source is not None:  # a self-oracle: the values of its own run on 1 rank, carried as data
        expected.source.values(expected)
    outputs = target.outputs_for(case)
    tol = runner.tolerance
    floating = {n for n, v in expected.ref.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}
    if tol.noise_model == "mca" and floating:
        judged = tol.judged_dtype(case.dtype)
        expected.unit_dtype = judged if judged != case.dtype else None
        estimate_noise(target, case, expected, tol.samples, outputs)
        first = dict(expected.noise)
        # what a gross mismatch's report prints: the first estimate widened by the flip probe's
        # full-scale pair (shardfuzz.verdict.decide), which the recheck's six can come out under (a
        # new user's script allowed 7.6e-07 where the report had allowed 1.02e-06)
        probe = min(FLIP_PROBE, tol.full_scale_samples)
        if probe:
            widen_full_scale(target, case, expected, probe, outputs)
        reported = dict(expected.noise)
        expected.noise = dict(first)
        # the bound a reported mismatch had: rechecked, and its flips looked for to the end (a gross
        # one skipped both; its script's bound is then wider: the script only passes more)
        confirm_noise(target, case, expected, tol, outputs)
        search_flips(target, case, expected, tol, outputs)
        # never narrower than what a gross mismatch's report printed (it skips the recheck, whose
        # pooled spread can come out smaller): the script only passes more
        expected.noise = {
            n: torch.maximum(v, reported[n].to(v.dtype)) if n in reported else v
            for n, v in expected.noise.items()
        }
    allowed = {}
    for n in [n for n in outputs if n in floating]:  # in output order: the script is stable
        fixed = tol.for_output(n)
        allowed[n] = (
            fixed.bound(expected.ref[n].double())
            if fixed is not None
            else tol.bound(
                expected.ref[n],
                expected.low[n],
                expected.noise.get(n),
                expected.mag.get(n),
                tol.judged_dtype(case.dtype),
                case.group_size,
                expected.case_scale,
            )
        ).float()
    layouts = {n: _layout_spec(lay, n) for n, lay in outputs.items()}
    in_layouts = {n: _layout_spec(target.input_layout(n), n, "input") for n in expected.inputs}
    dtensor_inputs = uses["ctx.local"] and any(spec[0] == "dtensor" for spec in in_layouts.values())
    if dtensor_inputs:  # made on the case's device mesh: the script's Mesh, once per case
        uses["ctx.mesh"] = True
    saved: dict[str, Any] = {}
    inputs_src = _tensors(expected.inputs, "inputs", saved)
    expected_src = _tensors({n: expected.ref[n] for n in outputs}, "expected", saved)
    allowed_src = _tensors(allowed, "allowed", saved)
    # never a path, nor a label an edited file put on another function (impl_ref is what runs)
    named = (
        record["impl"] in target.implementations and target.impl_ref(record["impl"]) == record["impl_spec"]
    )
    impl_name = record["impl"] if named else fname
    # cut to a length every file system takes (255 bytes a name), with room for "_N.py"
    name = f"repro_{re.sub(r'[^A-Za-z0-9_]+', '_', f'{target.name}_{impl_name}')}"[:STEM_LIMIT]
    # a file implementation by its file's name, not its path (the script is shared)
    shown_impl = f"{os.path.basename(in_file[0])}::{fname}" if in_file is not None else impl_name
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name + ".py")
    taken = 2
    while os.path.lexists(path):  # another finding's script of this implementation: kept, never replaced
        path = os.path.join(directory, f"{name}_{taken}.py")
        taken += 1
    sizes = ", ".join(f"{k}={v}" for k, v in case.sizes.items())
    doc = DOC.format(
        title=f"{target.name} / {shown_impl} ({record['kind']})",
        world=case.world_size,
        mesh=case.mesh,
        sizes=sizes,
        dtype=case.dtype,
        options=case.options,
        version=shardfuzz.__version__,
        date=datetime.date.today().isoformat(),
        script=os.path.basename(path),
        torch=torch.__version__,
        oracle=(
            "the float64 values of\nthe implementation's own run on 1 rank (the target's self-oracle)"
            if expected.source is not None
            else "the oracle's float64 values"
        ),
    )
    case_data = {
        "world_size": case.world_size,
        "mesh": case.mesh,
        "sizes": case.sizes,
        "dtype": case.dtype,
        "options": case.options,
        "seed": case.seed,
    }
    text = fill_template(
        harness_template(),
        values={
            "doc": docstring(doc),
            "case": pprint.pformat(case_data, width=100, sort_dicts=False),
            "inputs": inputs_src,
            "expected": expected_src,
            "allowed": allowed_src,
            "layouts": pprint.pformat(layouts, width=100, sort_dicts=False),  # checked in output order
            "input_layouts": pprint.pformat(in_layouts, width=100),
            "strided": repr(strided),
            "impl_name": fname,
            "kwargs": repr(dict(ref.kwargs)),
        },
        code={"imports": "\n".join(sorted({*HARNESS_IMPORTS, *closure.imports})), "impl": code},
        parts={
            "float.names": uses_float_names(
                pprint.pformat(case_data, width=100, sort_dicts=False), inputs_src, expected_src, allowed_src
            ),
            "Unsupported": bool(closure.shims),
            "inputs.pt": bool(saved),
            "outputs.dtensor": any(spec == ("dtensor",) for spec in layouts.values()),
            "outputs.owned": any(spec[0] == "owned" for spec in layouts.values()),
            "padded_flat": any(
                spec == ("padded_flat",) for spec in (*layouts.values(), *in_layouts.values())
            ),
            # fused blocks, declared or handed to ctx.shard (the script's piece splits each block)
            "shard.blocks": any(
                spec[0] == "shard" and len(spec) > 3 for spec in (*layouts.values(), *in_layouts.values())
            )
            or (uses["ctx.shard"] and "blocks" in code),
            "inputs.strided": bool(strided),
            "inputs.dtensor": dtensor_inputs,
            **uses,
            "ctx.extras": any(uses.values()),
        },
    )
    check_script(
        text, doc, {"CASE": case_data, "OUTPUT_LAYOUTS": layouts, **({"STRIDED": strided} if strided else {})}
    )
    if saved:
        torch.save(saved, os.path.splitext(path)[0] + ".pt")  # its own: scripts share a folder
    with open(path, "w") as f:
        f.write(text)
    return path
