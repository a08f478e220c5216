"""``octo-dist env`` says whether it runs in a container and which image, from what each runtime leaves behind
(fabricated here: the variables and the files under a root directory)."""

from __future__ import annotations

import json

import pytest

from octo_dist.envcheck import container

SIF = "/groups/gxx00000/octo-dist/octo-dist-cuda12.sif"
LABELS = {"org.opencontainers.image.version": "0.1.0", "io.github.octo-dist.profile": "cuda12"}


def image_root(tmp_path, *, labels=None, revision=None, dockerenv=False, containerenv=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    if labels is not None:
        (tmp_path / ".singularity.d").mkdir()
        (tmp_path / ".singularity.d" / "labels.json").write_text(labels)
    if revision is not None:
        (tmp_path / "opt" / "octo-dist").mkdir(parents=True)
        (tmp_path / "opt" / "octo-dist" / "REVISION").write_text(revision)
    if dockerenv:
        (tmp_path / ".dockerenv").write_text("")
    if containerenv is not None:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / ".containerenv").write_text(containerenv)
    return str(tmp_path)


@pytest.mark.parametrize("runtime", ["SINGULARITY", "APPTAINER"])
def test_singularity_or_apptainer_names_the_image_its_labels_and_our_revision(tmp_path, runtime):
    root = image_root(tmp_path, labels=json.dumps(LABELS), revision="1a2b3c4\n")
    env = {f"{runtime}_CONTAINER": SIF, "OCTO_DIST_PROFILE": "cuda12"}
    w = container.where(env, root)
    assert w == {
        "runtime": runtime.lower(),
        "image": SIF,
        "labels": LABELS,
        "octo_dist_image": "profile cuda12, revision 1a2b3c4",
    }
    assert container.as_line(w) == (
        f"{runtime.lower()}: {SIF}, version 0.1.0 (octo-dist image: profile cuda12, revision 1a2b3c4)"
    )


def test_apptainer_which_sets_both_names_is_apptainer(tmp_path):
    env = {"APPTAINER_CONTAINER": SIF, "SINGULARITY_CONTAINER": SIF}
    assert container.where(env, image_root(tmp_path))["runtime"] == "apptainer"


def test_podman_and_docker_are_told_apart(tmp_path):
    podman = image_root(
        tmp_path / "p", containerenv='engine="podman-4.3.1"\nimage="localhost/octo-dist:cpu"\n'
    )
    assert container.where({}, podman)["runtime"] == "podman"
    assert container.where({}, podman)["image"] == "localhost/octo-dist:cpu"
    docker = image_root(tmp_path / "d", dockerenv=True)
    assert container.where({"OCTO_DIST_PROFILE": "cpu"}, docker) == {
        "runtime": "docker",
        "image": "",
        "labels": {},
        "octo_dist_image": "profile cpu, revision unknown",
    }


def test_a_login_node_is_no_container_and_a_damaged_labels_file_is_no_labels(tmp_path):
    bare = image_root(tmp_path / "bare")
    assert container.as_line(container.where({}, bare)) == "none (not in a container)"
    damaged = image_root(tmp_path / "damaged", labels="{not json")
    w = container.where({"SINGULARITY_CONTAINER": SIF}, damaged)
    assert w["labels"] == {} and container.as_line(w) == f"singularity: {SIF}"


def test_a_profile_set_by_hand_outside_a_container_is_no_image(tmp_path):
    """OCTO_DIST_PROFILE is also how a user picks check-env's stack: alone, it says nothing of an image."""
    assert (
        container.where({"OCTO_DIST_PROFILE": "cuda12"}, image_root(tmp_path))["octo_dist_image"]
        == ""
    )
