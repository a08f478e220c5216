"""What the train step communicates: the default step all-reduces once on the CPU, on jax 0.4.20 and 0.4.22.

Counted in the compiled HLO (``.lower(...).compile().as_text()``) of the step on 2 forced CPU devices: each
all-reduce there is a gloo TCP round trip between processes, so the default must do one, over a flat vector.
"""

import pytest

from helpers import fast_version_runs
from octo_dist.engine import hlo
from octo_dist.engine import parallel as engine


@pytest.fixture(scope="module")
def collective_runs(tmp_path_factory):
    # Compiled fast (helpers.COMPILE_FAST): LLVM's optimisation level changes the machine code, not the HLO the
    # all-reduces are counted in (the same program printed the same counts at both levels on both versions; a third
    # of the CPU).
    runs = fast_version_runs("collectives.py", 2, tmp_path_factory.mktemp("collectives"))
    yield runs
    runs.close()


@pytest.fixture(scope="module", params=["0.4.20", "0.4.22"])
def observed(request, collective_runs):
    out = collective_runs.result(request.param)
    assert out["jax"] == request.param and out["devices"] == 2 and out["platform"] == "cpu", out
    return out


def test_default_step_on_the_cpu_all_reduces_once_over_one_flat_vector(observed):
    default = observed["steps"]["default"]
    assert default["runs"] == "shard_map"
    # Gradients, loss, each metric and the stop signal's one-hot over signal numbers, all f32, in one all-reduce.
    scalars = 1 + len(
        [m for m in default["metrics"] if m not in ("loss", "grad_norm", engine.STOP)]
    )
    assert default["all_reduces"] == [
        4 * (observed["params"] + scalars + observed["max_signal"])
    ], observed
    assert default["loss_finite"]


def test_jit_step_all_reduces_per_leaf_on_the_cpu(observed):
    # Why the CPU default is not jit: XLA's CPU pipeline has no all-reduce combiner.
    assert observed["steps"]["jit"]["runs"] == "jit"
    assert len(observed["steps"]["jit"]["all_reduces"]) > 10, observed["steps"]["jit"]


def test_auto_resolves_by_platform_and_names_are_checked():
    assert engine.resolve_step_fn("auto", "cpu", 2) == "shard_map"
    assert engine.resolve_step_fn("auto", "gpu", 16) == "jit"
    assert engine.resolve_step_fn("auto", "tpu", 8) == "jit"
    assert engine.resolve_step_fn("jit", "cpu", 2) == "jit"
    assert engine.resolve_step_fn("shard_map", "gpu", 8) == "shard_map"
    # one device in the whole mesh: nothing to all-reduce, so no flat gradient vector to pack ("auto" is jit)
    assert engine.resolve_step_fn("auto", "cpu", 1) == "jit"
    assert engine.resolve_step_fn("shard_map", "cpu", 1) == "shard_map"  # asked for by name: kept
    with pytest.raises(
        ValueError, match="'pmap'; expected one of \\('auto', 'jit', 'shard_map'\\)"
    ):
        engine.resolve_step_fn("pmap", "cpu", 2)


def test_all_reduces_are_counted_and_sized_from_hlo_text():
    cpu = (
        "  %fusion.182 = f32[84383]{0} fusion(f32[2,84383]{1,0} %p), kind=kLoop\n"
        "  %all-reduce = f32[84383]{0} all-reduce(f32[84383]{0} %fusion.182), channel_id=5, replica_groups={{0,1}}\n"
        "  %all-reduce.1 = bf16[2,3]{1,0} all-reduce(bf16[2,3]{1,0} %x), channel_id=6, to_apply=%add\n"
    )
    assert hlo.all_reduces(cpu) == [84383 * 4, 12]
    # GPU: async pairs, tuple-shaped when XLA's combiner merged several; the -done half is not a second one.
    gpu = (
        "  %all-reduce-start = (f32[10]{0}, s32[]) all-reduce-start(f32[10]{0} %a, s32[] %b), channel_id=1\n"
        "  %all-reduce-done = (f32[10]{0}, s32[]) all-reduce-done((f32[10]{0}, s32[]) %all-reduce-start)\n"
    )
    assert hlo.all_reduces(gpu) == [44]
    assert (
        hlo.all_reduces("  %all-gather = f32[16]{0} all-gather(f32[8]{0} %x), dimensions={0}\n")
        == []
    )
    assert hlo.shape_bytes("(f32[2,3]{1,0}, s32[])") == 28
