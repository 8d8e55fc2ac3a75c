"""The user-style example targets, written from the README with no hand-written error analysis:
each reference is clean in float32, bfloat16 and float64 under the default noise model, and each
planted bug is found. (The 2,000- and 10,000-example runs are ``benchmarks/no_false_positives.py``.)"""

from pathlib import Path

import pytest

import shardfuzz
from shardfuzz.spec.registry import get_target

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FILES = sorted(p.name for p in EXAMPLES.glob("*.py"))
PLANTED = [
    (name, impl)
    for name in FILES
    for impl in get_target(str(EXAMPLES / name)).implementations
    if impl != "reference" and not impl.startswith("reference")
]


def _target(name):
    return get_target(str(EXAMPLES / name))


@pytest.mark.parametrize("name", FILES)
def test_example_has_no_magnitude_and_its_reference_is_clean(name):
    target = _target(name)
    assert target.magnitude is None and not target.tolerance  # the noise model alone
    result = shardfuzz.run(target, profile="shardfuzz-ci", database=None, max_examples=80)
    assert not result.found, result.report
    low, wide = result.stats.triggers["bfloat16"], result.stats.triggers["float64"]
    assert low > 0 and wide > 0 and result.stats.examples - low - wide > 0, (
        result.stats.summary()
    )  # and float32


@pytest.mark.parametrize(("name", "impl"), PLANTED)
def test_example_planted_bug_is_found(name, impl):
    result = shardfuzz.run(_target(name), impl, profile="shardfuzz-ci", database=None, max_examples=200)
    assert result.found and result.kind == "mismatch", result.stats.summary()
    assert result.stats.margin is not None and result.stats.margin > 1


def test_the_edge_profiles_mask_in_a_softmax_input_leaves_the_reference_clean():
    # vocab_ce draws its logits as role="scores" with the edge profile: edge=max writes a finite
    # mask (-65504 * 2**-k) into one vocab column of every token; only those cases run here
    target = _target("vocab_ce.py")
    only_masks = ("profile != 'edge'", "options['edge'] != 'max'")
    result = shardfuzz.run(target, profile="shardfuzz-ci", database=None, max_examples=30, exclude=only_masks)
    assert not result.found, result.report
    assert result.stats.examples >= 20 and result.stats.triggers["edge=max"] == result.stats.examples, (
        result.stats.summary()
    )
    case = shardfuzz.Case(
        target="vocab_ce", world_size=2, mesh=(2,), sizes={"tokens": 3, "vocab": 5}, split=("vocab",),
        dtype="bfloat16", profile="edge", options={"ignore_index": -100, "edge": "max", "edge_exp": 0, "edge_slot": 1},
    )  # fmt: skip
    logits = target.inputs(case)["logits"]
    assert bool((logits[:, 1] == -65536.0).all())  # float16's lowest, rounded to bfloat16
    assert bool((logits[:, [0, 2, 3, 4]].abs() < 10).all())  # beside ordinary logits
