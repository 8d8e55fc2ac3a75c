"""A row-mean target whose oracle refuses a case it cannot handle (one row) with Unsupported, as an
implementation may: the case is rejected and counted by its reason, never an error of the target."""

import os

import shardfuzz
from shardfuzz.spec.registry import get_target

ROW_MEAN = get_target(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "oracle_raises.py") + "::TARGET"
)


def oracle(inp, case):
    if inp["x"].shape[0] < 2:
        raise shardfuzz.Unsupported("a mean over one row is the row itself", reason="one row")
    return {"mean": inp["x"].mean(0)}


TARGET = ROW_MEAN.derive("row_mean_refusing", oracle=oracle)


def refuse_every_case(inp, case):
    raise shardfuzz.Unsupported("torch: ColwiseParallel supports nn.Linear only", reason="not implemented")


#: a target that refuses every case it draws: a run of it tests nothing
REFUSES_ALL = ROW_MEAN.derive("row_mean_refusing_all", oracle=refuse_every_case)
