"""Which CUDA architectures jaxlib carries code for (check-env --deep's jaxlib.arch), and the first kernel's JIT time.

tests/cuobjdump/ holds two kinds of listing:

* ``recorded-*``: real output, recorded here (no GPU needed) by cuobjdump 13.5 (PyPI's nvidia-cuda-cuobjdump, the
  only one on PyPI) run on the libcusparse.so.12 of the nvidia-cusparse-cu12 12.1.2.141 wheel the cuda12 lock pins,
  and on libcupti.so.12 (no device code); stdout and stderr kept apart, the venv path shortened. They fix the
  format: ELF and PTX lines interleaved in fatbin order, each kind numbered from 1, and this cuobjdump stopping
  part way with "Invalid ELF" on a CUDA 12 library.
* the others (``ptx-only-sm90.txt``, ``sass-sm90.txt``, ``partial-sm90.txt``, ``no-sm90.txt``): written to that
  format, shaped like jaxlib 0.4.20's binaries (xla_extension.so with several fatbins, the custom-kernel modules
  _prng.so and _solver.so) under the build flags each name says. They were NOT recorded from jaxlib: its CUDA
  wheels cannot be downloaded here and no GPU is available. `octo-dist check-env --deep` on an H200 node prints the
  real answer (docs/abci.md, "ABCI 3.0's H200").
"""

import json
import os
import sys
from pathlib import Path

import pytest

from octo_dist.envcheck import archs
from octo_dist.envcheck.result import FAIL, OK, SKIP, WARN

from test_check_env import build_cudnn, fabricate, CUDA12, run_check

LISTINGS = Path(__file__).parent / "cuobjdump"


def listing(name: str) -> archs.Listing:
    return archs.parse_listing((LISTINGS / name).read_text())


def test_parser_reads_a_recorded_listing():
    got = listing("recorded-cuobjdump13.5-libcusparse-cu12-12.1.2.141.stdout")
    assert got.sass == {
        "sm_50": 3,
        "sm_52": 3,
        "sm_60": 3,
        "sm_61": 3,
        "sm_70": 3,
        "sm_75": 3,
        "sm_80": 3,
        "sm_86": 3,
        "sm_89": 3,
        "sm_90": 2,
    }
    assert got.ptx == {"sm_90": 2}
    status, why = archs.verdict(got, "sm_90")
    assert status == WARN and why.startswith("SASS for sm_90 in 2 image(s) only, 3 for sm_50")


def test_a_listing_that_stopped_part_way_is_reported_as_incomplete():
    stderr = (LISTINGS / "recorded-cuobjdump13.5-libcusparse-cu12-12.1.2.141.stderr").read_text()
    error = archs.cuobjdump_error("/v/nvidia/cusparse/lib/libcusparse.so.12", 1, stderr)
    assert error == (
        "libcusparse.so.12: cuobjdump fatal   : Invalid ELF in "
        "'/venv/lib/python3.10/site-packages/nvidia/cusparse/lib/libcusparse.so.12' (exit 1)"
    )
    no_code = (LISTINGS / "recorded-cuobjdump13.5-no-device-code.stderr").read_text()
    assert archs.cuobjdump_error("/v/libcupti.so.12", 255, no_code) == ""  # not an error
    assert archs.cuobjdump_error("/v/x.so", 0, "") == ""
    # A complete-looking SASS verdict from an incomplete listing is only a warning, and says to rerun.
    check = archs.check_listing(
        listing("sass-sm90.txt"), "sm_90", ["/s/xla_extension.so"], errors=[error]
    )
    assert (
        check.status == WARN
        and "listing incomplete: libcusparse.so.12: cuobjdump fatal" in check.found
    )
    assert check.remedy.startswith(archs.CUOBJDUMP_FIX)
    # Nor can "nothing runs" be concluded from part of a listing.
    partial = archs.check_listing(listing("no-sm90.txt"), "sm_90", ["/s/x.so"], errors=[error])
    assert partial.status == WARN and "no kernel image runs" in partial.found
    assert archs.check_listing(listing("no-sm90.txt"), "sm_90", ["/s/x.so"]).status == FAIL


def test_parser_counts_sass_and_ptx_per_architecture():
    got = listing("ptx-only-sm90.txt")
    # 6 fatbins in xla_extension.so + _prng.so + _solver.so, each with SASS up to sm_80 and compute_90 PTX.
    assert got.sass == {"sm_52": 8, "sm_60": 8, "sm_70": 8, "sm_80": 8}
    assert got.ptx == {"sm_90": 8}
    assert archs.describe(got) == "SASS sm_52 sm_60 sm_70 sm_80; PTX compute_90"


def test_parser_ignores_what_is_not_an_image_line():
    text = (
        "\ncuobjdump info    : File '/x/_versions.so' does not contain device code\n"
        "ELF file    1: _prng.1.sm_90a.cubin\n"
        "Fatbin elf code:\n"
        "PTX file    1: _prng.1.sm_90.ptx\n"
        "PTX file: no number\n"
    )
    got = archs.parse_listing(text)
    assert got.sass == {"sm_90a": 1} and got.ptx == {"sm_90": 1}
    assert not archs.parse_listing(
        (LISTINGS / "recorded-cuobjdump13.5-no-device-code.stderr").read_text()
    )


@pytest.mark.parametrize(
    "fixture,status,says",
    [
        ("sass-sm90.txt", OK, "SASS for sm_90 (sm_90) in 7 image(s): no JIT at start-up"),
        ("ptx-only-sm90.txt", WARN, "JIT-compiles every kernel from compute_90 PTX"),
        ("partial-sm90.txt", WARN, "SASS for sm_90 in 1 image(s) only, 7 for sm_52"),
        ("no-sm90.txt", FAIL, "no kernel image runs on this GPU"),
    ],
)
def test_verdict_for_an_h200(fixture, status, says):
    got_status, why = archs.verdict(listing(fixture), "sm_90")
    assert got_status == status and says in why, why


def test_sass_compatibility_follows_cuda_rules():
    assert archs.sass_runs_on("sm_80", "sm_86") and not archs.sass_runs_on("sm_86", "sm_80")
    assert not archs.sass_runs_on("sm_80", "sm_90")  # no SASS crosses a major version
    assert archs.sass_runs_on("sm_90a", "sm_90") and not archs.sass_runs_on("sm_90a", "sm_100")
    # On an A100 (sm_80) the cuda11-style build runs its own SASS: the verdict follows the GPU it is given.
    assert archs.verdict(listing("ptx-only-sm90.txt"), "sm_80")[0] == OK


def test_target_from_nvidia_smi_compute_cap():
    assert archs.target_arch("9.0\n9.0\n9.0\n") == "sm_90"
    assert archs.target_arch("8.0\n") == "sm_80"
    assert archs.target_arch("[N/A]\n") is None and archs.target_arch("") is None


def test_check_names_the_libraries_and_judges_for_sm90_without_a_gpu():
    libs = ["/s/jaxlib/xla_extension.so", "/s/jaxlib/cuda/_prng.so"]
    check = archs.check_listing(listing("ptx-only-sm90.txt"), None, libs)
    assert check.id == "jaxlib.arch" and check.status == WARN
    assert check.found.startswith(
        "SASS sm_52 sm_60 sm_70 sm_80; PTX compute_90 in _prng.so, xla_extension.so: no SASS for sm_90"
    )
    assert "no GPU visible: judged for sm_90, ABCI 3.0's H200" in check.found
    assert "check-env --deep --profile cuda12" in check.remedy
    on_a100 = archs.check_listing(listing("ptx-only-sm90.txt"), "sm_80", libs)
    assert on_a100.status == OK and "judged for" not in on_a100.found
    empty = archs.check_listing(archs.parse_listing(""), None, libs)
    assert empty.status == WARN and "no CUDA device code" in empty.found
    skipped = archs.check_listing(None, None, [], "cuobjdump not found")
    assert skipped.status == SKIP and skipped.found == "skipped: cuobjdump not found"


def test_jit_check_reports_the_first_kernel_load_time():
    check = archs.check_jit({"compile_s": 0.412, "first_run_s": 2.0, "steady_run_s": 0.0004})
    assert check.id == "deep.jit" and check.status == OK
    assert check.found.startswith(
        "first kernel: 2000 ms of module load and driver JIT (first run 2000 ms"
    )
    assert "XLA compile 412 ms" in check.found
    skipped = archs.check_jit(None, "JAX runs on the cpu backend here: no GPU kernel to time")
    assert skipped.status == SKIP and "cpu backend" in skipped.found


def test_kernel_libraries_are_found_in_the_site_dirs(tmp_path):
    site = tmp_path / "site"
    (site / "jaxlib" / "cuda").mkdir(parents=True)
    for name in ("jaxlib/xla_extension.so", "jaxlib/cuda/_prng.so", "jaxlib/cuda/_solver.so"):
        (site / name).write_bytes(b"")
    (site / "jaxlib" / "cuda" / "notes.txt").write_text("")
    found = archs.kernel_libraries([str(tmp_path / "empty"), str(site)])
    assert [os.path.relpath(p, site) for p in found] == [
        "jaxlib/xla_extension.so",
        "jaxlib/cuda/_prng.so",
        "jaxlib/cuda/_solver.so",
    ]


def test_kernel_libraries_of_the_cuda12_plugin_and_the_nvidia_wheels(tmp_path):
    # jax[cuda12] 0.4.23: PyPI's jaxlib, XLA's CUDA backend in jax_plugins/, the custom kernels in
    # jax_cuda12_plugin/, and the CUDA libraries in the nvidia-*-cu12 wheels (versioned sonames).
    site = tmp_path / "site"
    names = (
        "jaxlib/xla_extension.so",
        "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
        "jax_cuda12_plugin/_prng.so",
        "jax_cuda12_plugin/cuda_plugin_extension.so",
        "nvidia/cublas/lib/libcublasLt.so.12",
        "nvidia/cudnn/lib/libcudnn_cnn_infer.so.8",
        "nvidia/nccl/lib/libnccl.so.2",
    )
    for name in names + ("nvidia/cudnn/include/cudnn.h", "jax_plugins/xla_cuda12/__init__.py"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(b"")
    found = [os.path.relpath(p, site) for p in archs.kernel_libraries([str(site)])]
    assert found == list(names)  # every library, in that order; no header, no Python file


def test_cuobjdump_is_found_on_path_or_under_cuda_home(tmp_path):
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "cuobjdump"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert archs.cuobjdump_path({}, which=lambda n: "/usr/local/cuda/bin/cuobjdump") == (
        "/usr/local/cuda/bin/cuobjdump"
    )
    assert archs.cuobjdump_path({"CUDA_HOME": str(tmp_path)}, which=lambda n: None) == str(exe)
    assert archs.cuobjdump_path({}, which=lambda n: None) is None


# ---- check-env --deep for real, in a fabricated cuda12 environment with a stand-in cuobjdump -------------------


def _with_binaries(site: Path, bin_dir: Path, fixture: str) -> None:
    """jax[cuda12]'s binaries as empty files where the wheels put them, and a cuobjdump that prints ``fixture`` for
    the PJRT plugin (XLA's CUDA backend; the documented command line: ``cuobjdump --list-elf --list-ptx FILE``)
    and nothing for the others (PyPI's jaxlib/xla_extension.so has no device code)."""
    for name in (
        "jaxlib/xla_extension.so",
        "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
        "jax_cuda12_plugin/_prng.so",
    ):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(b"")
    fake = bin_dir / "cuobjdump"
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1 $2" = "--list-elf --list-ptx" ] || { echo "unexpected arguments: $*" >&2; exit 2; }\n'
        f'case "$3" in */xla_cuda_plugin.so) cat {LISTINGS / fixture} ;; '
        "*) echo \"cuobjdump info    : File '$3' does not contain device code\" >&2; exit 255 ;; esac\n"
    )
    fake.chmod(0o755)


def test_deep_reports_ptx_only_for_sm90_through_cuobjdump(tmp_path):
    site, bin_dir, manifest = fabricate(tmp_path, CUDA12)
    build_cudnn(site, 8907)
    _with_binaries(site, bin_dir, "ptx-only-sm90.txt")
    (bin_dir / "nvidia-smi").unlink()  # no GPU here: judged for sm_90
    rc, checks, proc = run_check(site, bin_dir, manifest, "--deep", "--no-gpu", profile="cuda12")
    arch = checks["jaxlib.arch"]
    assert arch["status"] == "warn", proc.stdout + proc.stderr
    # The plugin's libraries, the cuDNN wheel's and PyPI's jaxlib: every one listed, the plugin's code judged.
    assert arch["found"].startswith(
        "SASS sm_52 sm_60 sm_70 sm_80; PTX compute_90 in _prng.so, libcudnn.so.8, xla_cuda_plugin.so, "
        "xla_extension.so: no SASS for sm_90"
    ), arch["found"]
    assert "judged for sm_90" in arch["found"]
    # The JAX here is the CPU build: no GPU kernel ran, so no JIT time, and the reason says so.
    assert checks["deep.jit"]["status"] == "skip" and "cpu backend" in checks["deep.jit"]["found"]


def test_deep_reports_sass_for_sm90_in_the_plugin(tmp_path):
    site, bin_dir, manifest = fabricate(tmp_path, CUDA12)
    build_cudnn(site, 8907)
    _with_binaries(site, bin_dir, "sass-sm90.txt")
    (bin_dir / "nvidia-smi").unlink()
    rc, checks, proc = run_check(site, bin_dir, manifest, "--deep", "--no-gpu", profile="cuda12")
    assert checks["jaxlib.arch"]["status"] == "ok", proc.stdout + proc.stderr
    assert "xla_cuda_plugin.so" in checks["jaxlib.arch"]["found"]


def test_deep_skips_the_architecture_report_without_cuobjdump(tmp_path):
    site, bin_dir, manifest = fabricate(tmp_path, CUDA12)
    build_cudnn(site, 8907)
    (site / "jaxlib").mkdir()
    (site / "jaxlib" / "xla_extension.so").write_bytes(b"")
    path = f"{bin_dir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    rc, checks, proc = run_check(
        site,
        bin_dir,
        manifest,
        "--deep",
        "--no-gpu",
        profile="cuda12",
        env_extra={"PATH": path, "CUDA_HOME": ""},
    )
    if not checks:
        pytest.fail(proc.stdout + proc.stderr)
    arch = checks["jaxlib.arch"]
    assert arch["status"] == "skip" and "cuobjdump not found" in arch["found"]
    assert "module load cuda" in arch["found"]


def test_validate_shows_the_architecture_step_from_check_env():
    from octo_dist.apps.validate import app
    from octo_dist.apps.validate.report import FAIL as VFAIL, OK as VOK, SKIP as VSKIP

    def result(status, found="SASS sm_80; PTX compute_90 in xla_extension.so: no SASS for sm_90"):
        return {
            "checks": [
                {
                    "id": "jaxlib.arch",
                    "status": status,
                    "found": found,
                    "expected": "e",
                    "remedy": "r",
                },
                {
                    "id": "deep.jit",
                    "status": "ok",
                    "found": "first kernel: 900 ms",
                    "expected": "",
                    "remedy": "",
                },
            ]
        }

    warn = app.architecture_step(result("warn"))
    assert warn.status == VOK and warn.found.endswith("no SASS for sm_90; first kernel: 900 ms")
    assert app.architecture_step(result("fail")).status == VFAIL
    assert app.architecture_step(result("skip", "skipped: cuobjdump not found")).status == VSKIP
    assert app.architecture_step({"checks": []}).status == VSKIP
    assert json.dumps(app.architecture_step(None).found)
