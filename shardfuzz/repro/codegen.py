"""Generated Python (``shardfuzz repro``, ``repro --standalone``) never carries text by substitution.

Values of a failure record reach a script only as literals: ``repr``/``pprint`` for data, and
:func:`docstring` for the header, which writes a plain triple-quoted block only when that reads
back as exactly the same text, else the string's ``repr``. :func:`check_script` parses the script
and checks that its docstring and the listed literals are what was meant, so no field of a
record can become a statement.
"""

from __future__ import annotations

import ast
from typing import Any

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
        if name not in found or ast.literal_eval(found[name]) != value:
            raise ShardfuzzError(f"generated script: {name} is not the literal meant (a shardfuzz bug)")
