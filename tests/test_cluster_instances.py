"""The namespace clusters that may be up at once (``OCTOSIM_INSTANCE``): make test runs three side by side, so no
two instances may share a name, a subnet, a lock or a spool, and none may clean up another's leftovers. Pure: no
namespace is made here."""

from __future__ import annotations

import pytest

from cluster import sim

IFNAMSIZ = 15  # the longest network interface name Linux takes ("octosim-node001")


def test_each_instance_has_names_a_subnet_and_a_lock_of_its_own():
    prefixes = [sim.prefix_of(i) for i in range(10)]
    assert prefixes[0] == "octosim" and prefixes[1] == "octsim1" and prefixes[9] == "octsim9"
    assert len(set(prefixes)) == 10
    # Leftovers are found by "<prefix>-": no prefix followed by "-" starts another instance's names.
    for a in prefixes:
        for b in prefixes:
            assert a == b or not f"{b}-node001".startswith(f"{a}-"), (a, b)
    assert all(len(f"{p}-node001") <= IFNAMSIZ for p in prefixes)


def test_the_instance_is_one_digit_from_the_environment():
    assert sim._instance({}) == 0
    assert sim._instance({"OCTOSIM_INSTANCE": ""}) == 0
    assert sim._instance({"OCTOSIM_INSTANCE": "2"}) == 2
    for bad in ("10", "-1", "a", " 1", "1.0", "٣"):
        with pytest.raises(RuntimeError, match=r"OCTOSIM_INSTANCE=.*; expected one digit, 0 to 9"):
            sim._instance({"OCTOSIM_INSTANCE": bad})
