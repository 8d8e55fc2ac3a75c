"""A user target derived from the built-in tp_mlp in one call: another name, one more
implementation found in this module, the built-in's planted bugs left behind."""

from shardfuzz.targets import tp_mlp


def my_tp_mlp(ctx):
    """A user's TP MLP: here the built-in reference itself, called from the user's module."""
    return tp_mlp.reference(ctx)


def my_broken_tp_mlp(ctx):
    return tp_mlp.reference(ctx, bug="missing_allreduce")


MINE = tp_mlp.TARGET.derive("my_tp", implementations={"mine": "my_tp_mlp"})  # my_tp_mlp: in this file

# derived again: the first one's implementations stay resolved where they were found
BROKEN = MINE.derive("my_tp_broken", implementations={"broken": "my_broken_tp_mlp"}, description="mine")
