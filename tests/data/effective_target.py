"""TOY's sharded sum with a ``causal`` option that does nothing on a single element: declared
``effective`` only from two elements on (CAUSAL_SUM), and not declared (CAUSAL_SUM_PLAIN)."""

import os

from hypothesis import strategies as st

import shardfuzz.strategies as sst
from shardfuzz import Shard, Target
from shardfuzz.spec.refs import load_ref

TOY_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toy_target.py")
TOY = load_ref(f"{TOY_FILE}::TOY")


def cases(world_sizes=None):
    return sst.cases(
        "causal_sum",
        sizes={"n": sst.Split(max_per_rank=2)},
        options={"causal": st.booleans()},
        world_sizes=world_sizes,
        dtypes=("float32",),
        profiles=("normal",),
    )


def _target(name, **extra):
    return Target(
        name=name,
        cases=cases,
        inputs=TOY.inputs,
        oracle=TOY.oracle,
        outputs=TOY.outputs,
        input_layouts={"x": Shard(0)},
        implementations={"reference": f"{TOY_FILE}::reference"},
        triggers={"causal": lambda c: c.options["causal"]},
        **extra,
    )


CAUSAL_SUM = _target("causal_sum", effective={"causal": lambda c: c.sizes["n"] >= 2})
CAUSAL_SUM_PLAIN = _target("causal_sum_plain")
