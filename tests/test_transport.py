"""check-env --launch's InfiniBand transport check: fabricated /sys trees, a libibverbs built with gcc, and the
preflight verdict over fabricated rank records (one host vs several)."""

import shutil
import subprocess
from pathlib import Path

import pytest

from octo_dist.envcheck import launch as preflight
from octo_dist.envcheck import transport
from octo_dist.launchers import Launch
from helpers import HANG_S

HCAS = (
    "mlx5_ibn1",
    "mlx5_ibn2",
    "mlx5_ibn3",
    "mlx5_ibn4",
    "mlx5_ibn5",
    "mlx5_ibn6",
    "mlx5_ibn7",
    "mlx5_ibn8",
)


def fake_sys(root: Path, devices=HCAS, state="4: ACTIVE", dev=True) -> Path:
    """An ABCI 3.0 H node's /sys/class/infiniband: mlx5_ibn1..8, port 1 of each in ``state``; with ``dev``, its
    /dev/infiniband (uverbs0.. one per HCA, rdma_cm), as a container with --bind /dev/infiniband sees it."""
    for i, name in enumerate(devices):
        port = root / "sys/class/infiniband" / name / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "link_layer").write_text("InfiniBand\n")
        if dev:
            (root / "dev/infiniband").mkdir(parents=True, exist_ok=True)
            (root / "dev/infiniband" / f"uverbs{i}").write_text("")
    if dev:
        (root / "dev/infiniband/rdma_cm").write_text("")
    return root


def build_verbs(where: Path, export=True) -> Path:
    """A real shared library named libibverbs.so.1, exporting ibv_get_device_list (or not)."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    where.mkdir(parents=True, exist_ok=True)
    src = where / "verbs.c"
    body = (
        "void **ibv_get_device_list(int *n) { if (n) *n = 0; return 0; }\n"
        if export
        else "int unrelated(void) { return 1; }\n"
    )
    src.write_text(body)
    lib = where / "libibverbs.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def test_ib_devices_and_active_ports_from_a_fabricated_sys(tmp_path):
    root = fake_sys(tmp_path)
    assert transport.ib_devices(root) == list(HCAS)
    assert transport.active_ports(root, "mlx5_ibn1") == ["1"]
    down = fake_sys(tmp_path / "down", ("mlx5_0",), state="1: DOWN")
    assert transport.active_ports(down, "mlx5_0") == []
    assert transport.ib_devices(tmp_path / "no-ib") == []


def test_verbs_load_from_a_real_library_and_fail_without_the_symbol_or_the_file(tmp_path):
    good = build_verbs(tmp_path / "good")
    assert transport.load_verbs([str(good)]) is None
    bad = build_verbs(tmp_path / "bad", export=False)
    assert "exports no ibv_get_device_list" in transport.load_verbs([str(bad)])
    missing = transport.load_verbs([str(tmp_path / "none" / "libibverbs.so.1")])
    assert "cannot open shared object file" in missing or "No such file" in missing


@pytest.mark.parametrize(
    "spec,want",
    [
        ("mlx5_ibn", list(HCAS)),
        ("=mlx5_ibn1,mlx5_ibn2", ["mlx5_ibn1", "mlx5_ibn2"]),
        ("mlx5_ibn1:1", ["mlx5_ibn1"]),
        ("^mlx5_ibn1", list(HCAS[1:])),
        ("mlx5_0", []),
        ("=mlx5_ibn", []),
        ("^mlx5", []),
        ("", list(HCAS)),
    ],
)
def test_nccl_ib_hca_selection_follows_nccl_syntax(spec, want):
    assert transport.hca_selected(spec, HCAS) == want


@pytest.mark.parametrize(
    "env,what",
    [
        ({"NCCL_IB_DISABLE": "1"}, "NCCL_IB_DISABLE=1 turns InfiniBand off"),
        ({"NCCL_NET": "Socket"}, "NCCL_NET=Socket forces TCP sockets"),
        ({"NCCL_NET": "socket"}, "forces TCP sockets"),
        ({"NCCL_IB_HCA": "mlx5_0"}, "selects none of this host's HCAs"),
    ],
)
def test_settings_that_force_sockets_are_named_with_the_fix(env, what):
    (found,) = transport.socket_settings(env, HCAS)
    assert what in found and "fix:" in found


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"NCCL_IB_DISABLE": "0"},
        {"NCCL_NET": "IB"},
        {"NCCL_NET": "IBext"},
        {"NCCL_IB_HCA": "mlx5_ibn"},
        {"NCCL_SOCKET_IFNAME": "ib0"},
    ],
)
def test_settings_that_keep_infiniband_pass(env):
    assert transport.socket_settings(env, HCAS) == []


def launch(rank, world):
    return Launch(
        launcher="openmpi", rank=rank, world_size=world, local_rank=rank % 2, local_size=2
    )


def records(tmp_path, hosts, facts_of):
    world = len(hosts)
    return [
        preflight.rank_record(
            launch(r, world), None, {}, [], 8, host=h, transport_facts=facts_of(r)
        )
        for r, h in enumerate(hosts)
    ]


def test_a_multi_host_job_fails_when_verbs_cannot_load(tmp_path):
    root = fake_sys(tmp_path / "node")
    missing = [str(tmp_path / "image-without-rdma-core" / "libibverbs.so.1")]
    good = [str(build_verbs(tmp_path / "lib"))]

    def facts(r):
        return transport.facts(root, {}, missing if r == 3 else good)

    found = preflight.problems(records(tmp_path, ["h1", "h1", "h2", "h2"], facts), gpu_profile=True)
    (problem,) = found
    assert problem.startswith("rank 3 on h2 (8 InfiniBand HCA(s): mlx5_ibn1")
    assert (
        "libibverbs.so.1 cannot be loaded" in problem
        and "TCP sockets between the 2 hosts" in problem
    )
    assert "octo-dist image" in problem and "make sif" in problem


def test_a_multi_host_job_fails_on_nccl_ib_disable_and_passes_when_sound(tmp_path):
    root = fake_sys(tmp_path / "node")
    good = [str(build_verbs(tmp_path / "lib"))]
    bad = preflight.problems(
        records(
            tmp_path, ["h1", "h2"], lambda r: transport.facts(root, {"NCCL_IB_DISABLE": "1"}, good)
        ),
        gpu_profile=True,
    )
    assert len(bad) == 2 and all("NCCL_IB_DISABLE=1" in p for p in bad)
    assert (
        preflight.problems(
            records(tmp_path, ["h1", "h2"], lambda r: transport.facts(root, {}, good)), True
        )
        == []
    )


def test_one_host_or_no_infiniband_is_never_judged(tmp_path):
    root = fake_sys(tmp_path / "node")
    missing = [str(tmp_path / "none" / "libibverbs.so.1")]
    one_host = records(
        tmp_path, ["h1", "h1"], lambda r: transport.facts(root, {"NCCL_NET": "Socket"}, missing)
    )
    assert (
        preflight.problems(one_host, gpu_profile=True) == []
    )  # NVLink/PCIe inside a node: no network involved
    no_ib = records(
        tmp_path,
        ["h1", "h2"],
        lambda r: transport.facts(tmp_path / "plain", {"NCCL_NET": "Socket"}, missing),
    )
    assert no_ib[0]["transport"] == {
        "ib_devices": [],
        "uverbs": [],
        "verbs_error": None,
        "socket_settings": [],
    }
    assert preflight.problems(no_ib, gpu_profile=True) == []


def test_verbs_are_not_loaded_on_a_host_without_hcas(tmp_path):
    asked = []
    transport.facts(tmp_path, {}, ["libibverbs.so.1"], loader=lambda lib: asked.append(lib))
    assert asked == []


def test_the_preflight_table_shows_the_hcas(tmp_path):
    root = fake_sys(tmp_path / "node")
    recs = records(
        tmp_path, ["h1", "h2"], lambda r: transport.facts(root, {"NCCL_IB_DISABLE": "1"}, [])
    )
    text = preflight.render(recs, None, preflight.problems(recs, True))
    assert "infiniband: 8 HCA(s), 8 uverbs file(s), NCCL would use sockets" in text
    assert "FAIL  rank 0 on h1" in text


@pytest.mark.mpi
def test_check_env_launch_json_prints_the_per_rank_records_on_rank_0(mpirun):
    import json
    import platform

    import octo_dist

    proc = mpirun(
        2, "-m", "octo_dist", "check-env", "--launch", "--profile", "cpu", "--json", timeout=HANG_S
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    report = json.loads(proc.stdout)  # rank 0 alone writes to stdout
    assert report["octo_dist_version"] == octo_dist.__version__ and report["schema"] == 1
    assert (
        report["python"] == platform.python_version()
        and report["host"]
        and report["profile"] == "cpu"
    )
    assert report["ok"] and report["problems"] == [] and report["coordinator"]["address"]
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert all(r["jax"]["platform"] == "cpu" and r["world_size"] == 2 for r in report["ranks"])


def test_the_uverbs_device_files_are_reported(tmp_path):
    root = fake_sys(tmp_path / "node")
    assert transport.uverbs_files(root) == [f"uverbs{i}" for i in range(8)]
    assert transport.facts(root, {}, [str(build_verbs(tmp_path / "lib"))])["uverbs"] == [
        f"uverbs{i}" for i in range(8)
    ]


def test_a_multi_host_job_without_dev_infiniband_in_the_image_fails_with_the_bind_fix(tmp_path):
    """The HCAs show under /sys whatever is bound; without /dev/infiniband NCCL cannot open them and falls back to
    TCP sockets in silence: check-env --launch fails the job and names --bind /dev/infiniband."""
    root = fake_sys(tmp_path / "node", dev=False)
    good = [str(build_verbs(tmp_path / "lib"))]
    recs = records(tmp_path, ["h1", "h2"], lambda r: transport.facts(root, {}, good))
    found = preflight.problems(recs, gpu_profile=True)
    assert len(found) == 2 and all(
        "no verbs device files (/dev/infiniband/uverbs*)" in p for p in found
    )
    assert "--bind /dev/infiniband" in found[0], found[0]
    assert "0 uverbs file(s), NCCL would use sockets" in preflight.render(recs, None, found)
    one_host = records(tmp_path, ["h1", "h1"], lambda r: transport.facts(root, {}, good))
    assert preflight.problems(one_host, gpu_profile=True) == []
