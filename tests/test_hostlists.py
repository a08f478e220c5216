"""Slurm host-list expansion, checked against python-hostlist (a dev-only test oracle: GPL, never imported by
octo_dist) on a wide table of hand-written and generated lists, and malformed lists refused in one line."""

import random

import pytest

from octo_dist.launchers import hostlists
from octo_dist.launchers.hostlists import NodeListError, expand_nodelist

# Forms Slurm's hostlist.c accepts, and what real clusters print (ABCI, Cray nid, Frontier, Polaris, JUWELS...).
HAND_WRITTEN = [
    "g0001",
    "node[001-004,007]",
    "a1,b[1-2]x,c[09-11]",
    "node[1-10]",
    "node[01-10]",
    "node[001-010]",
    "node[8-10]",
    "node[08-10]",
    "node[8-010]",
    "node[099-101]",
    "node[00099-00101]",
    "n[0-0]",
    "n[5]",
    "rack[1-2]-n[01-02]",
    "n[1-2]-ib[0-1]",
    "x[00-02]y[1-2]z",
    "r[1-2]c[1-2]n[1-2]",
    "n[1,3,5-7]-ib",
    "nid0[2285-2289,2718-2723,5883-5890,7672-7679]",
    "nid0[4278-4279],nid04280",
    "frontier[00001-00004,00100]",
    "x3001c0s[13,19]b[0-1]n0",
    "jwb[0001-0003],jwb0100",
    "gpu-a100-[01-03].cluster.local",
    "[1-3]",
    "n1,n1,n2",
    "n[1-3],n2",
    "a,,b",
    ",a",
    "a,",
    "",
    "node[1-2],gpu[1-2],cpu[01-02]",
    "N[01-02]",
    "compute-1-[1-3]",
    "host.example.org",
    "n[001-003]x[1-2]",
    "cn[1-2,4-5],gpu1",
]


def generated(count=400, seed=14):
    """Lists built from random prefixes, ranges (with and without zero padding), suffixes and several groups."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        entries = []
        for _ in range(rng.randint(1, 3)):
            name = rng.choice(["n", "node", "gpu-", "r", "nid0", "c", "x3001c0s"])
            for g in range(rng.randint(0, 3)):
                pieces = []
                for _ in range(rng.randint(1, 3)):
                    width = rng.choice([1, 2, 3, 4])
                    lo = rng.randint(0, 10 ** min(width, 2))
                    hi = lo + rng.randint(0, 5)
                    pad = rng.random() < 0.6
                    fmt = (lambda v: f"{v:0{width}d}") if pad else str
                    pieces.append(fmt(lo) if rng.random() < 0.3 else f"{fmt(lo)}-{fmt(hi)}")
                name += (
                    "[" + ",".join(pieces) + "]" + rng.choice(["", "-ib", "n", "-", ".a"]) * (g < 2)
                )
            entries.append(name)
        out.append(",".join(entries))
    return out


TABLE = HAND_WRITTEN + generated()


def test_the_table_is_wide():
    assert len(set(TABLE)) >= 400


def test_every_list_expands_as_python_hostlist_does():
    oracle = pytest.importorskip("hostlist")  # the dev lock's python-hostlist 2.3.0
    mismatches = [
        (spec, expand_nodelist(spec), oracle.expand_hostlist(spec))
        for spec in TABLE
        if expand_nodelist(spec) != oracle.expand_hostlist(spec)
    ]
    assert not mismatches, mismatches[:5]


@pytest.mark.parametrize(
    "spec,hosts",
    [
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("n[1-2]-ib[0-1]", ["n1-ib0", "n1-ib1", "n2-ib0", "n2-ib1"]),
        ("node[8-10]", ["node8", "node9", "node10"]),
        ("node[08-10]", ["node08", "node09", "node10"]),
        ("n[1-2,5],m[01-02]", ["n1", "n2", "n5", "m01", "m02"]),
    ],
)
def test_known_expansions_without_the_oracle(spec, hosts):
    assert expand_nodelist(spec) == hosts


def test_slurm_also_separates_with_spaces_and_tabs():
    # hostlist_create(str, "\t, ", ...): python-hostlist keeps " b" as a name here; Slurm and octo-dist do not.
    assert expand_nodelist("a, b\tc[1-2]") == ["a", "b", "c1", "c2"]


@pytest.mark.parametrize(
    "spec,problem",
    [
        ("n[]", "empty brackets"),
        ("n[3-1]", "runs backwards"),
        ("n[", "'[' is never closed"),
        ("n[1-2", "'[' is never closed"),
        ("n]", "']' without '['"),
        ("n[1-2]]", "']' without '['"),
        ("n[[1-2]]", "nested '['"),
        ("n[a-b]", "range 'a-b' is not N or LOW-HIGH"),
        ("n[1-2-3]", "range '1-2-3' is not N or LOW-HIGH"),
        ("n[-1]", "range '-1' is not N or LOW-HIGH"),
        ("n[1,,2]", "range '' is not N or LOW-HIGH"),
        ("n[1-2,]", "range '' is not N or LOW-HIGH"),
        (
            "n[1 - 2]",
            "range '1 - 2' is not N or LOW-HIGH",
        ),  # separators inside brackets do not split
        ("n[0-70000]", "more than 65536"),
        ("a[0-60000]b[0-60000]", "expands to more than"),
    ],
)
def test_malformed_lists_are_refused_with_found_expected_fix(spec, problem):
    with pytest.raises(NodeListError) as e:
        expand_nodelist(spec, "SLURM_STEP_NODELIST")
    message = str(e.value)
    assert problem in message and f"SLURM_STEP_NODELIST={spec!r}" in message
    assert (
        "; expected a Slurm host list" in message and ". Fix: " in message and "\n" not in message
    )


def test_the_oracle_refuses_them_too():
    oracle = pytest.importorskip("hostlist")
    for spec in [
        "n[]",
        "n[3-1]",
        "n[",
        "n]",
        "n[1-2",
        "n[a-b]",
        "n[1-2-3]",
        "n[-1]",
        "n[[1-2]]",
        "n[1,,2]",
    ]:
        with pytest.raises(oracle.BadHostlist):
            oracle.expand_hostlist(spec)


def test_node_files(tmp_path):
    pbs = tmp_path / "pbs"
    pbs.write_text("hnode001\nhnode001\nhnode002\nhnode002\n")  # PBS: one line per mpiprocs slot
    pe = tmp_path / "pe"
    pe.write_text(
        "g0002 40 all.q@g0002 UNDEFINED\ng0001 40 all.q@g0001 UNDEFINED\n"
    )  # Grid Engine PE_HOSTFILE
    assert hostlists.node_list({"PBS_NODEFILE": str(pbs)}) == (
        "PBS_NODEFILE",
        ["hnode001", "hnode002"],
    )
    assert hostlists.node_list({"PE_HOSTFILE": str(pe)}) == ("PE_HOSTFILE", ["g0002", "g0001"])
    assert hostlists.node_list({"SLURM_JOB_NODELIST": "n[1-2]"}) == (
        "SLURM_JOB_NODELIST",
        ["n1", "n2"],
    )
    assert hostlists.node_list({}) is None
    with pytest.raises(hostlists.NodeFileError) as e:
        hostlists.node_list({"PBS_NODEFILE": str(tmp_path / "missing")})
    assert "cannot be read in this process (No such file or directory)" in str(e.value)


def test_a_node_file_past_the_bound_is_refused_not_read_to_the_end(tmp_path):
    # /dev/zero, or a variable naming the wrong file: read up to the bound, then refused in one line.
    big = tmp_path / "nodefile"
    with open(big, "wb") as f:
        f.truncate(hostlists.NODE_FILE_LIMIT + 1)
    var = hostlists.NODE_FILES[0]
    with pytest.raises(NodeListError, match=f"node file {big} is larger than 16 MiB"):
        hostlists.node_list({var: str(big)})
    with pytest.raises(NodeListError, match="is larger than 16 MiB"):
        hostlists.node_list({var: "/dev/zero"})
    ok = tmp_path / "ok"
    ok.write_text("node001\nnode002\n")
    assert hostlists.node_list({var: str(ok)}) == (var, ["node001", "node002"])
