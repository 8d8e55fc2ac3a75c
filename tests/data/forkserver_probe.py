"""Run in a process forked by shardfuzz's forkserver (tests/test_lifecycle.py): whether it leaves
without the interpreter's teardown (``shardfuzz.ranks.fast_exit.IN_FORKSERVER``)."""

import sys


def report(queue):
    fast_exit = sys.modules.get("shardfuzz.ranks.fast_exit")
    queue.put(None if fast_exit is None else fast_exit.IN_FORKSERVER)


def report_after_import(queue):
    """In a process of any other forkserver: import the module here, and say whether it registered."""
    from shardfuzz.ranks import fast_exit

    queue.put(fast_exit.IN_FORKSERVER)
