"""``tp_mlp`` on the plain MLP's cases only (no sequence-parallel branch), for ``bench_tp.py --plain``.

The sequence-parallel branch (LayerNorm, sequence-split input, all-gather and reduce-scatter) was
added to ``tp_mlp`` after commit 37b22b1; its cases cost the ranks about twice what a plain MLP
case does. A ``bench_tp.py`` figure of a checkout before that change and one after therefore
compare different work. This target draws the plain cases, with the same sizes, the same
reference, oracle and tolerances as ``tp_mlp``: the case distribution of ``bench_tp.py`` at
37b22b1, run through today's engine.
"""

import shardfuzz.strategies as sst
from shardfuzz.targets import tp_mlp


def cases(world_sizes=None):
    return sst.cases("tp_mlp_plain", sizes=tp_mlp.SIZES, world_sizes=world_sizes)


TARGET = tp_mlp.TARGET.derive("tp_mlp_plain", cases=cases)
