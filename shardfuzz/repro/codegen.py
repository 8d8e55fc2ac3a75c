"""Generated Python (``shardfuzz repro``, ``repro --standalone``) never carries text by substitution.

Values of a failure record reach a script only as literals: ``repr``/``pprint`` for data, and
:func:`docstring` for the header, which writes a plain triple-quoted block only when that reads
back as exactly the same text, else the string's ``repr``. :func:`check_script` parses the script
and checks that its docstring and the listed literals are what was meant, so no field of a
record can become a statement. :func:`fill_template` writes a script from a template file whose
marks say what goes where: a value (one expression, written from a value), code copied from the
implementation's module, or a part of the template kept or left out.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from shardfuzz.case import FLOAT_NAMES, read_literal
from shardfuzz.errors import ShardfuzzError


def docstring(text: str) -> str:
    """``text`` as a docstring literal: ``\"\"\"text\"\"\"`` when that reads back as ``text``, else
    ``repr(text)``."""
    plain = f'"""{text}"""'
    if '"""' not in text and "\\" not in text and not text.endswith('"') and _reads_as(plain, text):
        return plain
    return repr(text)


def _reads_as(literal: str, value: Any) -> bool:
    try:
        return ast.literal_eval(literal) == value
    except (ValueError, SyntaxError):
        return False


def check_script(text: str, doc: str, assigned: dict[str, Any]) -> None:
    """ShardfuzzError unless ``text`` parses, its docstring is ``doc`` and each top-level
    ``NAME = literal`` of ``assigned`` holds that value (a bug here, never the user's input)."""
    tree = ast.parse(text)
    if ast.get_docstring(tree, clean=False) != doc:
        raise ShardfuzzError("generated script: its docstring is not the text meant (a shardfuzz bug)")
    found = {
        node.targets[0].id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
    }
    for name, value in assigned.items():
        # compared as repr writes them: a NaN option is not equal to itself
        if name not in found or repr(read_literal(found[name])) != repr(value):
            raise ShardfuzzError(f"generated script: {name} is not the literal meant (a shardfuzz bug)")


#: what a script that writes ``inf`` or ``nan`` (a case's non-finite values, as ``repr`` writes
#: them) defines first, so that they read back as the floats they were
FLOAT_NAMES_LINE = 'inf, nan = float("inf"), float("nan")  # the non-finite values below, as repr writes them'


def uses_float_names(*literals: str) -> bool:
    """Whether any of the Python ``literals`` (shardfuzz wrote them) names ``inf`` or ``nan``."""
    return any(
        isinstance(node, ast.Name) and node.id in FLOAT_NAMES
        for text in literals
        for node in ast.walk(ast.parse(text, mode="eval"))
    )


#: a mark: ``#@ if NAME``, ``#@ if not NAME``, ``#@ else``, ``#@ end``, ``#@ insert NAME`` (a whole line)
_MARK = re.compile(r"[ \t]*#@ (?P<kind>if not|if|insert|else|end)(?: (?P<name>[\w.]+))?[ \t]*\n?")
_NAMED = {"if": True, "if not": True, "insert": True, "else": False, "end": False}
#: a template-only line (a mark, or a note to the reader)
_TEMPLATE_ONLY = re.compile(r"[ \t]*#@")
_VALUE = re.compile(r"\{\{(\w+)\}\}")


def fill_template(template: str, values: dict[str, str], code: dict[str, str], parts: dict[str, bool]) -> str:
    """The text of ``template`` with its marks filled in.

    A line whose first non-blank characters are ``#@`` is never written: ``#@ if NAME`` (``#@ if not
    NAME``) ... ``#@ else`` ... ``#@ end`` keep the lines between them when ``parts[NAME]`` is true
    (false); ``#@ insert NAME`` writes ``code[NAME]`` as lines of its own; any other ``#@`` line is a
    note to the template's reader. ``{{NAME}}`` on a written line becomes ``values[NAME]``, which
    must parse as one Python expression (a literal shardfuzz wrote with ``repr``/``pprint``, or a
    checked name), so no value becomes a statement; what is put in is never read for marks again.
    Every name given must appear in the template and every name it uses must be given:
    ShardfuzzError otherwise (a shardfuzz bug, never the user's input)."""
    for name, text in values.items():
        try:
            ast.parse(text, mode="eval")
        except SyntaxError:
            raise ShardfuzzError(f"template value {name!r} is not one expression (a shardfuzz bug)") from None
    lines = [(line, *_mark(line)) for line in template.splitlines(keepends=True)]
    used = {name for _, _, name in lines if name}
    used.update(v for line, kind, _ in lines if kind == "" for v in _VALUE.findall(line))
    given = set(values) | set(code) | set(parts)
    if used != given:
        raise ShardfuzzError(f"template: {sorted(used ^ given)} not both used and given (a shardfuzz bug)")
    out: list[str] = []
    keep: list[bool] = []  # per open ``#@ if``: whether its current branch is written
    for line, kind, name in lines:
        if kind == "" and all(keep):  # a line of the script: its values filled in
            out.append(_VALUE.sub(lambda m: values[m.group(1)], line))
        elif kind == "insert" and all(keep):
            out.append(code[name] + "\n")
        elif kind in ("if", "if not", "else", "end"):
            _branch(keep, kind, parts[name] if name else False)
    if keep:
        raise ShardfuzzError("template: an '#@ if' without '#@ end' (a shardfuzz bug)")
    return "".join(out)


def _mark(line: str) -> tuple[str, str]:
    """What a template line is: ``("", "")`` a line of the script, ``("note", "")`` a note, else a
    mark's kind and name (``""`` for ``else`` and ``end``). A line that starts like a mark but is
    not one is an error, not a note: a misspelt mark would otherwise write what it should not."""
    if _TEMPLATE_ONLY.match(line) is None:
        return "", ""
    m = _MARK.fullmatch(line)
    if m is not None and _NAMED[m["kind"]] == (m["name"] is not None):
        return m["kind"], m["name"] or ""
    if re.match(r"[ \t]*#@ (if|insert|else|end)\b", line):
        raise ShardfuzzError(f"template: a malformed mark {line.strip()!r} (a shardfuzz bug)")
    return "note", ""


def _branch(keep: list[bool], kind: str, part: bool) -> None:
    """Open (``if``), turn (``else``) or close (``end``) a kept-or-left-out part of the template."""
    if kind in ("if", "if not"):
        keep.append(part == (kind == "if"))
    elif not keep:
        raise ShardfuzzError(f"template: '#@ {kind}' without '#@ if' (a shardfuzz bug)")
    elif kind == "else":
        keep.append(not keep.pop())
    else:
        keep.pop()
