"""The equivalence check's two runs get the caller's XLA flags alike: a flag that changes how XLA compiles (here
the optimisation level) reaches the reference and every rank, a forced device count reaches neither (the reference
sets its own, each rank has one device)."""

from octo_dist.apps.smoke.equivalence import environments

FAST = "--xla_backend_optimization_level=0"


def test_the_callers_xla_flags_reach_both_runs_but_its_device_count_neither():
    base = {
        "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {FAST} --xla_cpu_enable_fast_math=false",
        "COORDINATOR_ADDRESS": "10.0.0.1:1234",
        "HOME": "/home/u",
    }
    ref, ranks = environments(2, base)
    shared = f"{FAST} --xla_cpu_enable_fast_math=false"
    assert ref["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {shared}"
    assert ranks["XLA_FLAGS"] == shared
    assert "COORDINATOR_ADDRESS" not in ref and "COORDINATOR_ADDRESS" not in ranks
    assert ref["HOME"] == ranks["HOME"] == "/home/u"


def test_without_xla_flags_the_ranks_get_none_and_the_reference_its_device_count():
    ref, ranks = environments(3, {"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert ref["XLA_FLAGS"] == "--xla_force_host_platform_device_count=3"
    assert "XLA_FLAGS" not in ranks
    ref, ranks = environments(2, {})
    assert (
        ref["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2" and "XLA_FLAGS" not in ranks
    )
