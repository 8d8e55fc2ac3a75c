"""Stage ``repro`` (layer 6 of 7: core < spec < ranks < verdict < report < engine < repro < frontends).

Reproducing a finding elsewhere: replay of failure files, torchrun and standalone reproducers,
and the literal-only code generation they share. Imports the engine and below.

- ``codegen.py``: generated scripts carry record fields only as literals, checked by parsing the
  script; templates filled in by marks (values as literals, code copied, parts kept or left out).
- ``replay.py``: replay of failure files.
- ``standalone.py``: `shardfuzz repro --standalone`, a reproducer that imports nothing but
  torch.
- ``standalone_script.py``: the standalone reproducer's text: its header, and the harness in plain
  torch read from ``templates/standalone_harness.py`` (package data, the script with marks).
- ``torchrun.py``: one case under torchrun, and the `shardfuzz repro` script.
"""
