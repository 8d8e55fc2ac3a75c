"""The standalone reproducer's text (:mod:`shardfuzz.repro.standalone` fills it in): the harness that
stands in for shardfuzz under torchrun, in plain torch, is the template file
``shardfuzz/repro/templates/standalone_harness.py`` (package data; its marks:
:func:`shardfuzz.repro.codegen.fill_template`); here are what reads it and the script's header."""

from __future__ import annotations

import functools
import re
from importlib import resources

#: the template, as a path inside this package (shipped as package data: pyproject.toml)
HARNESS = ("templates", "standalone_harness.py")

#: the harness's own imports, written in one sorted block with those the implementation needs
HARNESS_IMPORTS = (
    "import datetime",
    "import os",
    "import random",
    "import sys",
    "import torch",
    "import torch.distributed as dist",
)

#: the parts of the harness's ``ctx`` written only when the implementation's code uses them: the
#: template's ``#@ if`` name -> the text that shows the use (the implementation's parameter is
#: ``ctx`` by convention)
CTX_USES = {
    "ctx.mesh": "ctx.mesh",
    "ctx.local": "ctx.local",
    "ctx.shard": "ctx.shard(",
    "ctx.dtype": "ctx.dtype",
    # the mesh's per-axis groups (ctx.mesh.groups[0], or a mesh read into a name first)
    "mesh.groups": ".groups",
}

#: the script's docstring (written as a literal by :func:`shardfuzz.repro.codegen.docstring`)
DOC = """Reproducer: {title}.

{world} rank(s), mesh {mesh}; sizes {sizes}; {dtype}; options {options}.
Run: torchrun --nproc-per-node={world} {script}    (add --backend nccl for GPUs)
Needs only torch (written with torch {torch} by shardfuzz {version} on {date}). Each rank runs the
implementation below on its inputs and compares its outputs with {oracle},
within the tolerance shardfuzz allows a mismatch after its recheck (a report of a mismatch far
past it shows the narrower bound before the recheck, which it skips there); every wrong output of
a rank, or an error, fails the run. A rank stuck in a collective (a hang) fails after
COLLECTIVE_TIMEOUT_S seconds instead of waiting forever.
"""


@functools.cache
def harness_template() -> str:
    """The harness template's text, read from the installed package (a wheel, a zip, a checkout)."""
    path = resources.files("shardfuzz.repro")
    for part in HARNESS:
        path = path.joinpath(part)
    return path.read_text(encoding="utf-8")


@functools.cache
def harness_names() -> frozenset[str]:
    """The module-level names the harness defines (read from its template: ``def``, ``class`` and
    assignments at the start of a line); the implementation's copied code must not define them."""
    found = re.findall(r"^(?:def|class)\s+(\w+)|^(\w+)\s*=", harness_template(), re.M)
    return frozenset(a or b for a, b in found)
