"""The toy target (tests/data/toy_target.py) with one of ``two_bugs``' bugs declared as a known
failure: cases with 3 ranks or more are set aside while fuzzing, counted, never passed."""

import os

import shardfuzz.strategies as sst
from shardfuzz import Shard, Target
from shardfuzz.spec.refs import load_ref

TOY_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_target.py")
TOY = load_ref(f"{TOY_FILE}::TOY")


def cases_known(world_sizes=None):
    return sst.cases(
        "toy_known",
        sizes={"n": sst.Split(max_per_rank=2)},
        world_sizes=world_sizes,
        dtypes=("float32",),
        profiles=("normal",),
    )


#: the toy target with one of two_bugs' bugs declared as a known failure, set aside while fuzzing
TOY_KNOWN = Target(
    name="toy_known",
    description="sharded sum, with a known failure",
    cases=cases_known,
    inputs=TOY.inputs,
    oracle=TOY.oracle,
    outputs=TOY.outputs,
    input_layouts={"x": Shard(0)},
    implementations={"reference": f"{TOY_FILE}::reference", "two_bugs": f"{TOY_FILE}::two_bugs"},
    known_failures={"rank 2 raises": "world_size >= 3"},
)
