"""`octo-dist launch --image`: the image's profile (from its file name) against the resource type's GPUs."""

import pytest

from octo_dist import cli
from octo_dist.jobs import imagefit


@pytest.mark.parametrize(
    "image,profile",
    [
        ("/groups/gxx00000/octo-dist/octo-dist_cuda11.sif", "cuda11"),
        ("octo-dist-cuda12.sif", "cuda12"),
        ("cuda12.sif", "cuda12"),
        ("/x/octo-dist.cpu.sif", "cpu"),
        (
            "/groups/cuda11-things/octo-dist.sif",
            None,
        ),  # a directory's name says nothing of the file
        ("octo-dist.sif", None),
        ("mycuda11.sif", None),  # not a word of the name
        ("octo-dist-cuda11-to-cuda12.sif", None),  # two profiles: cannot tell
    ],
)
def test_the_profile_is_read_from_the_file_name(image, profile):
    assert imagefit.image_profile(image) == profile


def test_cuda11_on_h200_warns_with_the_choice_and_the_trade_off():
    refusal, warning = imagefit.check("/g/octo-dist_cuda11.sif", "rt_HF")
    assert refusal is None and "\n" not in warning
    assert warning.startswith(
        "--image octo-dist_cuda11.sif is the cuda11 profile on rt_HF (H200, sm_90): "
    )
    assert "only PTX for sm_90" in warning and "make sif PROFILE=cuda12" in warning
    assert "check-env --deep" in warning
    assert imagefit.check("/g/octo-dist_cuda11.sif", "rt_HG")[1]  # the same GPU, one of it


@pytest.mark.parametrize(
    "image,resource_type",
    [
        ("octo-dist-cuda12.sif", "rt_HF"),
        ("octo-dist_cuda11.sif", "rt_F"),  # V100: what cuda11 was made for
        ("octo-dist_cuda11.sif", None),  # SLURM: no resource type, no architecture known
        ("octo-dist.sif", "rt_HF"),  # no profile in the name: nothing visible to judge
        (None, "rt_HF"),  # the venv, not an image
    ],
)
def test_what_fits_or_cannot_be_seen_passes_silently(image, resource_type):
    assert imagefit.check(image, resource_type) == (None, None)


def test_the_cpu_image_on_gpu_nodes_is_refused():
    refusal, warning = imagefit.check("octo-dist-cpu.sif", "rt_HF")
    found, expected, fix = refusal
    assert found == "--image octo-dist-cpu.sif (the cpu profile) on rt_HF (H200, sm_90)"
    assert "leaves every GPU idle" in expected and "PROFILE=cuda12" in fix and warning is None


def test_launch_prints_the_warning_and_still_renders(tmp_path, capsys):
    argv = ["launch", "pbs", "--nodes", "1", "--group", "g1", "--skip-image-check", "--dry-run"]
    assert cli.main([*argv, "--image", "/g/octo-dist_cuda11.sif"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("#!/bin/bash")
    (line,) = err.strip().splitlines()
    assert line.startswith("octo-dist launch: warning: --image octo-dist_cuda11.sif is the cuda11")
    assert cli.main([*argv, "--image", "/g/octo-dist_cuda12.sif"]) == 0
    assert capsys.readouterr().err == ""


def test_launch_refuses_the_cpu_image_on_gpu_nodes_before_writing(tmp_path, capsys):
    out = tmp_path / "job.sh"
    argv = ["launch", "pbs", "--nodes", "1", "--group", "g1", "--skip-image-check"]
    assert cli.main([*argv, "--image", "/g/octo-dist-cpu.sif", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "octo-dist launch: error: --image octo-dist-cpu.sif (the cpu profile) on rt_HF"
    )
    assert "Fix: --image octo-dist-cuda12.sif" in err and not out.exists()
