"""Reproducers to file upstream: ``shardfuzz repro FILE --standalone`` on failures the fuzzer finds
in PyTorch's ``loss_parallel`` (expected failures of ``vocab_parallel``).

Each test takes the failure file of the search that proves the expected failure (the ``proof``
fixture: the search of tests/test_targets.py, run once per session), writes the standalone script
from it, runs it on its ranks and checks that it fails the same way while importing
nothing but torch and the standard library. One runs under real torchrun (``UNDER_TORCHRUN``);
the others on ranks that tests/data/script_ranks.py forks with torchrun's environment (no agent,
and no import of torch: one server per test process has it, conftest.ScriptRanks). The scripts shipped in ``examples/upstream/`` must be
what the tool writes today (the header's date and version aside).
"""

import ast
import glob
import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from shardfuzz import Case
from shardfuzz.errors import ShardfuzzError
from shardfuzz.frontends import cli
from shardfuzz.frontends.testing import run_cli
from shardfuzz.repro.codegen import fill_template
from shardfuzz.repro.standalone_script import harness_template

UPSTREAM = Path(__file__).resolve().parent.parent / "examples" / "upstream"
#: the reproducer that runs under real torchrun in the ci suite (the others run their ranks by
#: tests/data/script_ranks.py, as torchrun starts them, without its agent)
UNDER_TORCHRUN = "torch_scan_negative_dim"

#: the modules a standalone script must not import
FORBIDDEN = ("shardfuzz", "hypothesis", "pytest")

WRAPPER = """\
import json, os, runpy, signal, sys
# torchrun stops the other ranks with SIGTERM when one fails: let them write their list too
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
finally:  # what the script imported, whatever way it ended
    # a SIGTERM while writing left an empty list (seen once under load): ignored from here, and
    # the list appears whole or not at all
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    bad = sorted(m for m in sys.modules if m.split(".")[0] in {forbidden!r})
    path = os.path.join({out!r}, "modules-" + os.environ["RANK"] + ".json")
    with open(path + ".tmp", "w") as f:
        json.dump(bad, f)
    os.replace(path + ".tmp", path)
"""


#: the session's tests/data/script_ranks.py server (conftest.ScriptRanks), set for this module's tests
LAUNCHER = None


@pytest.fixture(autouse=True)
def _launcher(script_ranks):
    global LAUNCHER
    LAUNCHER = script_ranks


def _torchrun(script: Path, n: int, out: Path, agent: bool = True) -> subprocess.CompletedProcess:
    """``script`` on ``n`` ranks under torchrun (``agent``), or forked as torchrun would start them
    by tests/data/script_ranks.py: the same environment, no new import of torch."""
    wrapper = out / "wrapper.py"
    wrapper.write_text(WRAPPER.format(forbidden=FORBIDDEN, out=str(out)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COV_CORE_SOURCE")}
    env["OMP_NUM_THREADS"] = "1"
    if not agent:
        assert LAUNCHER is not None
        return LAUNCHER.run(n, [wrapper, script], env, out, timeout=240)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={n}",
            "--standalone",
            wrapper,
            script,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=out,
    )


#: the script's ALLOWED block, and a number in it
ALLOWED_BLOCK = re.compile(r"^ALLOWED = \{$.*?^\}$", re.S | re.M)
NUMBER = re.compile(r"-?(?:\d+\.\d*(?:e[+-]?\d+)?|\d+e[+-]?\d+|inf|nan)")


def _body(text: str) -> tuple[str, list[float]]:
    """The script without its header's 'written with ... on DATE' line and with its allowed errors
    masked, and those errors. A bound holds |the oracle rerun in the case dtype - float64|, whose
    last bits differ from one CPU to another (float32 GELU and matmul kernels): the shipped
    tp_mlp/torch_tp script allowed 7.05e-08 in grad_x where an AMD EPYC writes 6.68e-08."""
    text = "\n".join(line for line in text.splitlines() if "written with torch" not in line)
    block = ALLOWED_BLOCK.search(text)
    if block is None:
        return text, []
    allowed = [float(n) for n in NUMBER.findall(block.group())]
    masked = text[: block.start()] + NUMBER.sub("X", block.group()) + text[block.end() :]
    return masked, allowed


def _same_allowed(shipped: list[float], written: list[float]) -> bool:
    """The same number of allowed errors, each within a factor of 1.5 of the shipped one: a few of
    the case dtype's roundings of the output apart, never a bound that changed its form."""
    return len(shipped) == len(written) and all(
        a == b or (a > 0 and b > 0 and max(a, b) <= 1.5 * min(a, b)) for a, b in zip(shipped, written)
    )


#: dtensor_ops' expected failures in torch 2.13 (targets/dtensor_ops.py), each with what its script
#: must fail with; one silent wrong result runs under torchrun in the ci suite, the others under
#: -m slow (each starts 1-2 ranks that import torch: 5-8 s)
DTENSOR_OPS = {
    "torch_scan_negative_dim": "elements wrong",
    "torch_inplace_squeeze": "holds a local piece of shape []",
    "torch_amax_empty_shard": "amax(): Expected reduction dim to be specified for input.numel() == 0",
    "torch_cummax_backward": "scatter_add.default got mixed torch.Tensor and DTensor",
    "torch_threshold_partial_max": "elements wrong",
    "torch_select_backward_negative_dim": "select(): index 0 out of range",
    "torch_logsumexp_keepdim": "holds a local piece of shape [1, 0]",
    "torch_sgn_backward_plain_grad": "output 'grad_x' must be a DTensor, got Tensor",
    "torch_add_partial_product_sum": "elements wrong",
    "torch_norm_inf_empty_shard": "cannot compute the inf norm",
    "torch_norm_inf_partial_max": "elements wrong",
    "torch_norm_inf_backward": "elements wrong",
}


@pytest.mark.parametrize(
    ("target", "record", "error"),
    [
        pytest.param(  # the same reproducer path as the one below: its search is the long one
            "vocab_parallel",
            "torch_loss_parallel_weight_ignore",
            "index -100 is out of bounds",
            marks=pytest.mark.slow,
        ),
        (
            "vocab_parallel",
            "torch_loss_parallel_no_class",
            "index 0 is out of bounds for dimension 1 with size 0",
        ),
        # torch's TP reads ctx.mesh.ranks: the script's Mesh had none, and a new user's reproducer
        # of the docs' first PyTorch finding failed in the script itself
        ("tp_mlp", "torch_tp", "a and b must have same reduction dim"),
        *(
            pytest.param(
                "dtensor_ops",
                record,
                error,
                marks=[] if record == UNDER_TORCHRUN else pytest.mark.slow,
            )
            for record, error in DTENSOR_OPS.items()
        ),
    ],
)
def test_standalone_reproducer_of_a_found_failure_fails_the_same_way_with_torch_only(
    tmp_path, target, record, error, proof
):
    # the failure file of test_targets' search for this record (found and shrunk to its declared
    # case there): one search per session
    failures = proof(target, record)
    (found,) = glob.glob(str(failures / "*.json"))
    assert cli.main(["repro", found, "--standalone", "-o", str(tmp_path / "out")]) == cli.EXIT_OK
    (script,) = (tmp_path / "out").glob("repro_*.py")
    text = script.read_text()
    assert "shardfuzz" not in "\n".join(
        line for line in text.splitlines() if line.startswith(("import", "from"))
    )
    n = json.loads(Path(found).read_text())["case"]["world_size"]
    res = _torchrun(script, n, tmp_path, agent=record == UNDER_TORCHRUN)
    assert res.returncode != 0, res.stdout + res.stderr
    assert error in res.stderr, res.stderr[-4000:]
    # the script allows at least what the engine did: never a worse ratio than the report's (a new
    # user's reproducer said 186x where the report said 136x: a gross mismatch's report skips the
    # recheck, whose pooled spread can come out smaller)
    ratio = json.loads(Path(found).read_text()).get("ratio")
    for worst in re.findall(r"worst ([\d.e+-]+)x the allowed error", res.stderr):
        assert ratio is not None and float(worst) <= ratio * 1.006, (worst, ratio)  # printed to 3 digits
    lists = sorted(tmp_path.glob("modules-*.json"))  # a rank killed inside a collective writes none
    assert lists, res.stderr[-4000:]
    for path in lists:
        imported = json.loads(path.read_text())
        assert imported == [], f"{path.stem}: imported {imported}"
    shipped = UPSTREAM / script.name
    assert shipped.exists(), f"ship {script.name} in examples/upstream/ (shardfuzz repro --standalone)"
    (shipped_code, shipped_allowed), (code, allowed) = _body(shipped.read_text()), _body(text)
    assert shipped_code == code, f"examples/upstream/{script.name} is stale: regenerate it"
    assert _same_allowed(shipped_allowed, allowed), (
        f"examples/upstream/{script.name} is stale (its allowed errors): regenerate it",
        shipped_allowed,
        allowed,
    )


def _search(failures: Path, target: str, impl: str, examples: int = 60):
    """The fuzzer's finding of ``impl`` on the file ``target`` (a search, ``shardfuzz-ci``): its
    result and its failure file, written under ``failures``."""
    import shardfuzz

    result = shardfuzz.run(
        target, impl, profile="shardfuzz-ci", database=None, max_examples=examples, failures_dir=str(failures)
    )
    assert result.found, result.report
    (found,) = glob.glob(str(failures / "*.json"))
    return result, found


def _script_of(found: str, out: Path) -> Path:
    """The standalone script ``shardfuzz repro --standalone`` writes from the failure file ``found``."""
    assert cli.main(["repro", found, "--standalone", "--trust-refs", "-o", str(out)]) == cli.EXIT_OK
    (script,) = out.glob("repro_*.py")
    return script


def _standalone_of_a_finding(tmp_path: Path, target: str, impl: str, examples: int = 60):
    """The fuzzer's finding of ``impl`` on the file ``target`` and the standalone script of it."""
    result, found = _search(tmp_path / "failures", target, impl, examples)
    return result, _script_of(found, tmp_path / "out")


def _fails_the_same_way(script: Path, world_size: int, tmp_path: Path, output: str | None) -> None:
    """The script, run on its ranks as torchrun starts them, fails with wrong elements (of
    ``output``, if named) and imports none of shardfuzz, hypothesis or pytest on any rank."""
    res = _torchrun(script, world_size, tmp_path, agent=False)
    assert res.returncode != 0, res.stdout + res.stderr
    assert "elements wrong" in res.stderr, res.stderr[-4000:]
    assert output is None or f"output {output!r}:" in res.stderr, res.stderr[-4000:]
    for path in sorted(tmp_path.glob("modules-*.json")):
        assert json.loads(path.read_text()) == [], path.stem


def test_a_reduction_over_the_dp_groups_of_a_2d_mesh_gets_a_reproducer_that_fails_the_same_way(tmp_path):
    """The tutorial's dp x tp pattern reduces over ``ctx.mesh.groups[0]``: the script's mesh had no
    ``groups``, and every rank of a new user's reproducer raised AttributeError."""
    target = str(Path(__file__).resolve().parent / "data" / "dp_target.py")
    result, script = _standalone_of_a_finding(tmp_path, target, "averaged_over_dp")
    assert result.kind == "mismatch" and len(result.case.mesh) == 2, result.report
    assert "self.groups = tuple(" in script.read_text()
    _fails_the_same_way(script, result.case.world_size, tmp_path, "total")


def test_an_output_its_named_rank_owns_gets_a_reproducer_that_fails_the_same_way(tmp_path):
    """``Owned(rank=-1)``, the layout the docs give a pipeline's loss on its last stage: the
    standalone script refused it, so no pipeline finding got one. The owner compares the whole
    value; every other rank must hold an empty tensor."""
    target = str(Path(__file__).resolve().parent / "data" / "owned_target.py")
    result, script = _standalone_of_a_finding(tmp_path, target, "own_rows_only")
    assert result.kind == "mismatch" and result.case.world_size >= 2, result.report
    assert "'loss': ('owned', -1)" in script.read_text()
    _fails_the_same_way(script, result.case.world_size, tmp_path, "loss")
    res = _torchrun(script, result.case.world_size, tmp_path, agent=False)
    assert "rank 0: all outputs within the allowed error" in res.stdout, res.stdout  # not its owner


def test_a_file_implementation_with_a_dtensor_output_gets_a_reproducer_that_fails_the_same_way(tmp_path):
    # the README's way of writing an implementation (file.py::NAME), on a file target, returning a
    # FromDTensor() output: amax's pending max relabelled as a pending sum (tests/data)
    here = Path(__file__).resolve().parent
    target = str(here / "data" / "dtensor_placements.py")
    impl = str(here / "data" / "dtensor_relabel.py") + "::max_called_sum"
    result, script = _standalone_of_a_finding(tmp_path, target, impl, examples=80)
    assert result.kind == "mismatch", result.report
    assert script.name == "repro_dtensor_placements_max_called_sum.py"  # no path, no colon
    text = script.read_text()
    assert "def max_called_sum(ctx):" in text and str(here) not in text  # no local path either
    assert "'y': ('dtensor',)" in text
    _fails_the_same_way(script, result.case.world_size, tmp_path, "y")


def test_a_target_with_dtensor_inputs_gets_a_reproducer_that_hands_them_over_as_dtensors(tmp_path):
    # AsDTensor(Shard(0)) inputs (tests/data/dtensor_target.py): the script makes the same DTensor on
    # each rank (distribute_tensor, no collective) on one device mesh per case, as the ranks did
    target = str(Path(__file__).resolve().parent / "data" / "dtensor_target.py")
    result, script = _standalone_of_a_finding(tmp_path, target, "local_sum_called_total")
    assert result.kind == "mismatch", result.report
    text = script.read_text()
    assert "INPUT_LAYOUTS = {'x': ('dtensor', (('shard', 0),), 'impl')}" in text, text
    assert "def as_dtensor(value, layout, device_mesh):" in text
    _fails_the_same_way(script, result.case.world_size, tmp_path, "total")


def test_a_finding_that_needs_the_ranks_random_state_gets_a_reproducer_that_seeds_torch_as_they_did(tmp_path):
    # tests/data/toy_impls.py::rare_random_offset is wrong only where the case seed's first draw
    # from torch's global generator is under 0.05: the ranks seed it with the case seed, and so
    # must the script (unseeded, 1 in 20 of its runs would fail)
    here = Path(__file__).resolve().parent
    impl = f"{here / 'data' / 'toy_impls.py'}::rare_random_offset"
    result, script = _standalone_of_a_finding(tmp_path, str(here / "data" / "toy_target.py"), impl, 200)
    assert result.kind == "mismatch" and result.case.seed != 0, result.report  # seed 0 draws 0.50
    assert f"'seed': {result.case.seed}" in script.read_text()
    _fails_the_same_way(script, result.case.world_size, tmp_path, "x2")


def test_a_self_oracle_target_gets_a_reproducer_with_the_values_of_its_one_rank_run(tmp_path):
    # oracle="self": the script carries the float64 values the implementation computed on 1 rank
    target = str(Path(__file__).resolve().parent.parent / "examples" / "row_parallel_self.py")
    result, script = _standalone_of_a_finding(tmp_path, target, "bias_every_rank")
    assert result.kind == "mismatch", result.report
    assert "the implementation's own run on 1 rank (the target's self-oracle)" in script.read_text()
    _fails_the_same_way(script, result.case.world_size, tmp_path, None)


def test_an_implementation_written_with_import_shardfuzz_gets_a_reproducer_that_fails_the_same_way(tmp_path):
    # `raise shardfuzz.Unsupported(...)` as the target spec writes it, and `shardfuzz.Shard(0)`: each
    # `shardfuzz.NAME` becomes a plain NAME the script carries (it said "the implementation uses
    # the module 'shardfuzz'" and wrote nothing)
    here = Path(__file__).resolve().parent
    impl = f"{here / 'data' / 'module_style_impls.py'}::wrong_rank1_module_style"
    result, script = _standalone_of_a_finding(tmp_path, str(here / "data" / "toy_target.py"), impl)
    assert result.kind == "mismatch", result.report
    text = script.read_text()
    assert 'raise Unsupported("one rank: nothing is split", reason="one rank")' in text, text
    assert "start = Shard(0).global_index(" in text and "class Shard(" in text, text
    assert "shardfuzz." not in "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")
    )
    _fails_the_same_way(script, result.case.world_size, tmp_path, "x2")


def test_a_standalone_script_says_what_it_cannot_carry_from_shardfuzz():
    """The module itself handed on cannot be carried: the error says how to write it instead."""
    from shardfuzz.repro.standalone import _Closure

    sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
    try:
        import module_style_impls as m
    finally:
        sys.path.pop(0)
    with pytest.raises(
        ShardfuzzError,
        match=r"uses the module 'shardfuzz' itself .*from shardfuzz import NAME, or shardfuzz\.NAME",
    ):
        _Closure().add_object(m.passes_the_module_on, "passes_the_module_on")
    closure = _Closure()
    closure.add_object(m.uses_a_submodule, "uses_a_submodule")  # an alias of a module: its names carried
    assert "split_sizes(ctx.inputs" in closure.defs[-1] and "def split_sizes(" in "\n".join(closure.defs)


def test_a_statement_that_binds_several_names_is_copied_once(tmp_path, monkeypatch):
    # found by a new user: `LR, B1, B2, EPS = ...` came out four times, once a name
    from shardfuzz.repro.standalone import _Closure

    (tmp_path / "several_names.py").write_text(
        "LR, B1, B2 = 1e-2, 0.9, 0.999\n\n\ndef step(x):\n    return x * LR * B1 * B2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import several_names

    closure = _Closure()
    closure.add_object(several_names.step, "step")
    assert [d for d in closure.defs if d.startswith("LR, B1, B2 =")] == ["LR, B1, B2 = 1e-2, 0.9, 0.999"]
    assert closure.defined() == ["LR", "B1", "B2", "step"]


@pytest.fixture(scope="module")
def flat_finding(tmp_path_factory):
    """tests/data/flat_target.py's padding_in_norm, found once for the two tests below."""
    target = str(Path(__file__).resolve().parent / "data" / "flat_target.py")
    return _search(tmp_path_factory.mktemp("flat-failures"), target, "padding_in_norm")


def test_a_zero_style_flat_buffer_gets_a_reproducer_that_compares_its_shards_without_the_padding(
    tmp_path, flat_finding
):
    # PaddedFlat() outputs (ZeRO's flat buffers, tests/data/flat_target.py): the script compares
    # each rank's ceil(n / world) elements without the padding (it refused the layout)
    result, found = flat_finding
    script = _script_of(found, tmp_path / "out")
    assert result.kind == "mismatch" and result.case.sizes["n"] % result.case.world_size, result.report
    assert "OUTPUT_LAYOUTS = {'p': ('padded_flat',), 'norm': ('replicate',)}" in script.read_text()
    _fails_the_same_way(script, result.case.world_size, tmp_path, "norm")
    # the reference's own values pass the script's check: the padding is never compared
    ref = _torchrun(_with_impl(script, "reference"), result.case.world_size, tmp_path, agent=False)
    assert (
        ref.returncode == 0
        and ref.stdout.count("all outputs within the allowed error") == result.case.world_size
    ), ref.stdout + ref.stderr


def test_a_fused_layout_gets_a_reproducer_that_splits_each_block(tmp_path):
    # Shard(0, blocks=2) (a fused [gate; up] weight, examples/fused_swiglu.py): the script hands
    # each rank its shard of both blocks and compares them so; the reference passes it
    target = str(UPSTREAM.parent / "fused_swiglu.py")
    result, script = _standalone_of_a_finding(tmp_path, target, "naive_chunk", examples=12)
    text = script.read_text()
    assert "'grad_w_gu': ('shard', 0, 'dtensor', 2)" in text, text
    _fails_the_same_way(script, result.case.world_size, tmp_path, "grad_w_gu")
    call = "**{'naive': True})"
    assert call in text
    right = script.with_name("repro_fused_swiglu_reference.py")
    right.write_text(text.replace(call, "**{})"))
    ref = _torchrun(right, result.case.world_size, tmp_path, agent=False)
    assert (
        ref.returncode == 0
        and ref.stdout.count("all outputs within the allowed error") == result.case.world_size
    ), ref.stdout + ref.stderr


def test_two_scripts_in_one_folder_keep_their_own_names_and_inputs(tmp_path, monkeypatch, flat_finding):
    """A second script of the same implementation (another finding) was written over the first,
    and every script of a folder read one ``inputs.pt``: each now has its own name and inputs."""
    import shardfuzz.repro.standalone as standalone

    monkeypatch.setattr(standalone, "INLINE_NUMEL", 0)  # every tensor to the file beside the script
    result, found = flat_finding
    first = _script_of(found, tmp_path / "out")
    assert cli.main(["repro", found, "--standalone", "--trust-refs", "-o", str(first.parent)]) == cli.EXIT_OK
    second = first.with_name(first.stem + "_2.py")
    assert sorted(p.name for p in first.parent.iterdir()) == sorted(
        [first.name, first.stem + ".pt", second.name, second.stem + ".pt"]
    )
    assert 'os.path.splitext(os.path.abspath(__file__))[0] + ".pt"' in second.read_text()
    (first.with_suffix(".pt")).unlink()  # the second reads its own inputs, not the first's
    _fails_the_same_way(second, result.case.world_size, tmp_path, "norm")


def test_a_script_is_named_after_the_function_that_runs_not_an_edited_label(tmp_path, flat_finding):
    """A file whose ``impl`` was edited to another implementation of the target (``reference``)
    while its ``impl_ref`` still names the bug: the script was called ``..._reference.py`` and
    titled so, while it runs padding_in_norm."""
    _, found = flat_finding
    record = json.loads(Path(found).read_text())
    assert record["impl"] == "padding_in_norm"
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(dict(record, impl="reference")))
    script = _script_of(str(edited), tmp_path / "out")
    assert "padding_in_norm" in script.name and "reference" not in script.name, script.name
    assert "/ reference (" not in script.read_text()


def _with_impl(script: Path, name: str) -> Path:
    """The script with its call of the implementation under test replaced by ``name``, a function
    of tests/data/flat_target.py that the script does not carry (copied in after the harness)."""
    import inspect

    sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
    try:
        import flat_target
    finally:
        sys.path.pop(0)
    text = script.read_text()
    helper = inspect.getsource(getattr(flat_target, name))  # its helper _step is carried already
    text = text.replace("\ndef main():", f"\n{helper}\n\ndef main():", 1)
    text = text.replace("check(ctx, padding_in_norm(ctx, **{}))", f"check(ctx, {name}(ctx, **{{}}))", 1)
    out = script.with_name(f"with_{name}.py")
    out.write_text(text)
    return out


def test_a_finding_that_needs_strided_inputs_gets_a_reproducer_that_hands_them_over_strided(tmp_path):
    # tests/data/strided_target.py: all-reducing an input view in place fails only once the view is
    # non-contiguous (strided=True); a script that built contiguous pieces would pass instead
    target = str(Path(__file__).resolve().parent / "data" / "strided_target.py")
    result, script = _standalone_of_a_finding(tmp_path, target, "in_place")
    assert result.case.options["strided"] is True, result.report
    assert "STRIDED = ('g',)" in script.read_text()
    _fails_the_same_way(script, result.case.world_size, tmp_path, "total")


def test_a_script_names_every_wrong_output_of_a_rank_in_the_targets_order(tmp_path, monkeypatch):
    """A rank's check lists every wrong output, in the target's order as the report does: it
    stopped at the first, in alphabetical order (a new user's rank 1 said ``grad_k`` where the
    report said ``out`` first). The check runs here on rank 1's expected pieces with two changed,
    its script loaded as a module (its ``main`` is not run: no torchrun)."""
    import importlib.util
    import types

    from shardfuzz.spec.registry import get_target

    toy = str(Path(__file__).resolve().parent / "data" / "toy_target.py")
    result, script = _standalone_of_a_finding(tmp_path, toy, "wrong_rank1")
    spec = importlib.util.spec_from_file_location("repro_under_test", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    order = list(get_target(toy).outputs_for(result.case))
    assert list(mod.OUTPUT_LAYOUTS) == order == ["total", "x2", "parts", "count"]
    monkeypatch.setattr(mod.dist, "all_reduce", lambda tensor, group=None: None)  # "parts": one rank here
    ctx = types.SimpleNamespace(rank=1, group_rank=1, group_size=result.case.world_size, group=None)
    outputs = {
        n: mod.piece(mod.EXPECTED[n], layout, 1, ctx.group_size) for n, layout in mod.OUTPUT_LAYOUTS.items()
    }
    mod.check(ctx, outputs)  # the oracle's own pieces pass
    outputs["x2"], outputs["total"] = outputs["x2"] + 1, outputs["total"] + 1
    with pytest.raises(AssertionError) as e:
        mod.check(ctx, outputs)
    text = str(e.value)
    assert "output 'total':" in text and "output 'x2':" in text, text
    assert text.index("output 'total':") < text.index("output 'x2':"), text


# -- the harness template ------------------------------------------------------------------------
def test_the_harness_template_reads_as_python():
    ast.parse(harness_template())  # its marks are comments, {{NAME}} values and a bare {{doc}}


TEMPLATE = """{{doc}}
#@ a note, never written
#@ insert code
X = {{x}}
#@ if big
    #@ if not small
Y = 1
    #@ else
Y = 2
    #@ end
#@ end
"""


def test_fill_template_writes_values_code_and_the_parts_asked_for():
    text = fill_template(
        TEMPLATE,
        values={"doc": repr("{{x}}"), "x": repr({"k": "#@ end {{doc}}"})},
        code={"code": "import os"},
        parts={"big": True, "small": False},
    )
    # what is put in is never read for marks again
    assert text == "'{{x}}'\nimport os\nX = {'k': '#@ end {{doc}}'}\nY = 1\n"


@pytest.mark.parametrize(
    ("template", "values", "parts", "error"),
    [
        ("X = {{x}}\n", {"x": "1\nimport os"}, {}, "not one expression"),  # a value is never a statement
        ("X = {{x}}\n", {"x": "1; import os"}, {}, "not one expression"),
        ("X = {{y}}\n", {"x": "1"}, {}, "not both used and given"),
        ("#@ if big\n#@ end\n", {}, {"big": True, "small": True}, "not both used and given"),
        ("#@ if big:\n#@ end\n", {}, {"big": True}, "malformed mark"),  # a misspelt mark is no note
        ("#@ end\n", {}, {}, "without '#@ if'"),
        ("#@ if big\n", {}, {"big": True}, "without '#@ end'"),
    ],
)
def test_fill_template_refuses_what_is_not_meant(template, values, parts, error):
    with pytest.raises(ShardfuzzError, match=error):
        fill_template(template, values=values, code={}, parts=parts)


def test_every_dtensor_ops_expected_failure_has_a_reproducer_test():
    from shardfuzz.spec.registry import get_target

    assert set(DTENSOR_OPS) == set(get_target("dtensor_ops").expected_failures)


def test_a_case_with_an_infinite_option_reruns_replays_and_gets_scripts_that_run(tmp_path):
    """A new user's clipping norm drew norm_type inf: the report's rerun line was refused ("malformed
    node"), ``repro`` crashed with a ValueError, ``--option norm_type=inf`` and an exclusion naming
    inf were refused. repr writes inf as ``inf``: every reader takes it, and a script defines it."""
    here = Path(__file__).resolve().parent
    target = str(here / "data" / "norm_target.py")
    result, found = _search(tmp_path / "failures", target, "inf_summed")
    assert result.kind == "mismatch" and result.case.options["p"] == float("inf"), result.report
    line = next(ln for ln in result.report.splitlines() if ln.startswith("Rerun this case"))
    assert Case.parse(re.search(r"\"(Case\(.*\))\"", line).group(1)) == result.case, line
    rerun = run_cli("case", target, "--impl", "inf_summed", repr(result.case))
    assert rerun.returncode == 1 and "FAIL (mismatch)" in rerun.stdout, rerun.stdout + rerun.stderr
    pinned = run_cli("fuzz", target, "--impl", "inf_summed", "--option", "p=inf", "--max-examples", "5",
                     "--failures-dir", str(tmp_path / "pinned"))  # fmt: skip
    assert pinned.returncode == 1 and "FOUND mismatch" in pinned.stdout, pinned.stdout + pinned.stderr
    excluded = run_cli("fuzz", target, "--impl", "inf_summed", "--exclude", "options['p'] == inf",
                       "--max-examples", "20", "--failures-dir", str(tmp_path / "excluded"))  # fmt: skip
    assert excluded.returncode == 0 and "nothing found" in excluded.stdout, excluded.stdout + excluded.stderr
    torchrun_script = tmp_path / "repro.py"
    assert cli.main(["repro", found, "--trust-refs", "-o", str(torchrun_script)]) == cli.EXIT_OK
    module = runpy.run_path(str(torchrun_script))  # not as __main__: its RECORD, not a run
    assert module["RECORD"]["case"]["options"] == {"p": float("inf")}
    script = _script_of(found, tmp_path / "out")
    assert 'inf, nan = float("inf"), float("nan")' in script.read_text()
    _fails_the_same_way(script, result.case.world_size, tmp_path, "norm")
