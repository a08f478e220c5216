"""env/stack.toml parsing: the rules every consumer of a pin relies on."""

import copy
from pathlib import Path

import pytest

from octo_dist.stack import manifest as mf

RAW = mf.loads(mf.DEFAULT_MANIFEST.read_text())


def parse(data):
    return mf.parse_manifest(data, Path("stack.toml"))


def test_the_committed_manifest_pins_the_known_fixes():
    m = mf.load_manifest()
    cuda = m.profile("cuda11")
    pins = cuda.exact_pins("3.10")
    assert pins["scipy"] == "1.12.0"  # scipy 1.13 removed scipy.linalg.tril
    assert (
        pins["nvidia-cudnn-cu11"] == "8.6.0.163"
    )  # jaxlib cudnn86, not the 9.x jax[cuda11_pip] pulls
    assert pins["jaxlib"] == "0.4.20+cuda11.cudnn86"
    assert pins["jax"] == "0.4.20"
    assert cuda.python == "3.10" and cuda.gpu
    assert {d.name for d in m.git} == {"octo", "dlimp"}
    assert m.profile("cpu").exact_pins("3.11")["jax"] == "0.4.22"


def test_the_cuda12_profile_pins_every_cuda12_library_and_cudnn_89():
    cuda12 = mf.load_manifest().profile("cuda12")
    pins = cuda12.exact_pins("3.10")
    # jax[cuda12] 0.4.23 from PyPI: the CPU jaxlib plus the plugin pair, nothing by URL.
    for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"):
        assert pins[name] == "0.4.23", name
    assert cuda12.direct == () and cuda12.cudnn_build == "8.9"
    assert pins["nvidia-cudnn-cu12"] == "8.9.7.29"  # cudnn89: 9.x would not load
    # jax[cuda12]==0.4.23's libraries (its METADATA), each pinned exactly, and no CUDA 11 one.
    extra = {
        "nvidia-cublas-cu12",
        "nvidia-cuda-cupti-cu12",
        "nvidia-cuda-nvcc-cu12",
        "nvidia-cuda-runtime-cu12",
        "nvidia-cudnn-cu12",
        "nvidia-cufft-cu12",
        "nvidia-cusolver-cu12",
        "nvidia-cusparse-cu12",
        "nvidia-nccl-cu12",
        "nvidia-nvjitlink-cu12",
    }
    assert extra <= set(pins) and not [n for n in pins if n.endswith("-cu11")]
    # No CUDA base image: the plain Ubuntu base of the cpu image, the driver from the host.
    assert cuda12.image_base == "cpu" and cuda12.python == "3.10" and cuda12.gpu


def test_cudnn_build_must_be_a_major_minor(tmp_path):
    data = mf.loads(mf.DEFAULT_MANIFEST.read_text())
    data["profiles"]["cuda12"]["cudnn_build"] = "cudnn89"
    with pytest.raises(
        mf.ManifestError, match=r'cudnn_build must be a cuDNN major.minor like "8.9"'
    ):
        mf.parse_manifest(data, tmp_path / "stack.toml")


def test_per_python_requirements_apply_to_their_python_only():
    cpu = mf.load_manifest().profile("cpu")
    assert cpu.requirements_for("3.10")["protobuf"] == "==3.20.3"
    assert cpu.requirements_for("3.11")["protobuf"] == "==4.25.3"


def test_inherit_takes_only_the_named_common_requirements():
    p = mf.load_manifest().profile("jax020-cpu")
    reqs = p.requirements_for("3.11")
    assert reqs["jax"] == "==0.4.20" and reqs["flax"] == "==0.7.5"
    assert "tensorflow" not in reqs and "wandb" not in reqs


def test_a_branch_instead_of_a_commit_is_refused():
    data = copy.deepcopy(RAW)
    data["git"]["octo"]["commit"] = "main"
    with pytest.raises(
        mf.ManifestError, match=r"git.octo.commit must be a full 40-hex commit SHA, found 'main'"
    ):
        parse(data)


def test_short_sha_is_refused():
    data = copy.deepcopy(RAW)
    data["git"]["dlimp"]["commit"] = "5edaa46"
    with pytest.raises(mf.ManifestError, match="full 40-hex"):
        parse(data)


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(
        mf.ManifestError, match=r"unknown profile 'cuda13'.*cpu, cuda11, cuda12, jax020-cpu"
    ):
        mf.load_manifest().profile("cuda13")


def test_wrong_schema_and_missing_file_are_clear(tmp_path):
    with pytest.raises(mf.ManifestError, match="expected `schema = 1`, found 2"):
        parse({"schema": 2})
    with pytest.raises(mf.ManifestError, match=r"no manifest at .*nope.toml.*OCTO_DIST_MANIFEST"):
        mf.load_manifest(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("schema = [")
    with pytest.raises(mf.ManifestError, match="not valid TOML"):
        mf.load_manifest(bad)


def test_manifest_and_profile_come_from_the_environment(tmp_path):
    assert mf.manifest_path({mf.MANIFEST_ENV: "/opt/octo-dist/env/stack.toml"}) == Path(
        "/opt/octo-dist/env/stack.toml"
    )
    assert mf.manifest_path({}) == mf.DEFAULT_MANIFEST
    assert mf.default_profile({mf.PROFILE_ENV: "cuda11"}) == "cuda11"
    assert mf.default_profile({}) is None


def test_canonical_names():
    assert mf.canonical_name("Tensorflow_Datasets") == "tensorflow-datasets"
    assert mf.canonical_name("ml.dtypes") == "ml-dtypes"


def test_direct_wheel_public_version():
    jaxlib = mf.load_manifest().profile("cuda11").direct[0]
    assert jaxlib.public_version == "0.4.20"
    assert jaxlib.url.endswith("jaxlib-0.4.20+cuda11.cudnn86-cp310-cp310-manylinux2014_x86_64.whl")


def test_lock_cutoff_is_read_from_the_manifest():
    assert mf.load_manifest().lock_exclude_newer == "2026-12-01T00:00:00Z"


@pytest.mark.parametrize(
    "path,value,message",
    [
        (
            ("profiles", "cuda11", "gpu"),
            "false",
            r"stack.toml: profiles.cuda11.gpu must be true or false, found 'false' "
            r"\(string\) \(write gpu = false\)",
        ),
        (
            ("profiles", "cpu", "lock_pythons"),
            "3.11",
            r"profiles.cpu.lock_pythons must be an array, found '3.11' \(string\)",
        ),
        (
            ("profiles", "cpu", "lock_pythons"),
            ["3.11", 3.12],
            r"profiles.cpu.lock_pythons must be an array of strings, found 3.12",
        ),
        (
            ("profiles", "cpu", "python"),
            3.1,
            r"profiles.cpu.python must be a string, found 3.1 \(float\)",
        ),
        (("profiles", "cpu"), "x", r"profiles.cpu must be a table"),
        (("profiles",), [1], r"profiles must be a table"),
        (
            ("common", "requirements", "numpy"),
            1.24,
            r"common.requirements.numpy must be a version string",
        ),
        (("git", "octo", "url"), None, r"git.octo.url is missing; expected a string"),
        (
            ("images", "cuda11", "tag"),
            11,
            r"images.cuda11.tag must be a string, found 11 \(integer\)",
        ),
        (
            ("profiles", "cuda11", "overrides"),
            [{"package": "x"}],
            r"profiles.cuda11.overrides\[0\].version is missing",
        ),
        (("common", "by_python", "3.10"), 1, r'common.by_python."3.10" must be a table'),
        (
            ("profiles", "cpu", "lock_pythons"),
            [],
            r"profiles.cpu.lock_pythons is empty; expected at least one Python",
        ),
        (
            ("profiles", "cpu", "gpu"),
            1,
            r"profiles.cpu.gpu must be true or false, found 1 \(integer\)",
        ),
    ],
)
def test_the_manifest_is_validated_by_type_naming_the_file_and_key(path, value, message):
    data = copy.deepcopy(RAW)
    table = data
    for key in path[:-1]:
        table = table[key]
    if value is None:
        del table[path[-1]]
    else:
        table[path[-1]] = value
    with pytest.raises(mf.ManifestError, match=message):
        parse(data)


def test_gpu_must_be_a_boolean_in_the_file_too(tmp_path):
    bad = tmp_path / "stack.toml"
    bad.write_text(mf.DEFAULT_MANIFEST.read_text().replace("gpu = true", 'gpu = "false"'))
    with pytest.raises(
        mf.ManifestError, match=rf"{bad}: profiles.cuda11.gpu must be true or false"
    ):
        mf.load_manifest(bad)
