"""FSDP2's state with its DTensors' placements dropped (tests/test_dtensor_outputs.py): each rank returns
its local piece as a plain tensor, which the target's declared layouts (Replicate, Owned) reject."""

from shardfuzz.targets.zero_fsdp2 import fsdp2


def fsdp2_local_pieces(ctx):
    return {name: value.to_local() for name, value in fsdp2(ctx).items()}
