"""The container definitions: linted, parsed, tied to env/, and the install script they run, run for real.

No Docker engine or Singularity runs here, so the images themselves are validated, not built; the
opt-in `buildah` test at the end builds the cpu image for real where buildah and a local base exist.
"""

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from octo_dist.stack import digests, dockerfile, imagecontract, imagedefs, singularitydef
from octo_dist.stack import manifest as mf
from helpers import HANG_S

REPO = mf.REPO_ROOT
BIN = Path(sys.executable).parent
MANIFEST = mf.load_manifest()
DOCKERFILE = (REPO / "Dockerfile").read_text()
DEFINITION = (REPO / "singularity.def").read_text()
# Every GPU profile's image: its Dockerfile target and its Singularity definition, checked alike.
GPU_PROFILES = ("cuda11", "cuda12")
DEFINITIONS = {p: (REPO / imagecontract.definition_file(p)).read_text() for p in GPU_PROFILES}
NEW_DIGEST = "sha256:" + "ab" * 32


def tool(name: str) -> str:
    """A dev tool from the venv (env/locks/*-dev.txt); missing is a failure, not a skip, so CI cannot pass vacuously."""
    exe = BIN / name
    if not exe.exists():
        pytest.fail(
            f"{name} not found beside {sys.executable}; expected the dev lock installed: make dev-env"
        )
    return str(exe)


def mutate(text: str, old: str, new: str) -> str:
    """Replace exactly one occurrence, so a drift test can never run on an unchanged copy."""
    assert text.count(old) == 1, f"expected exactly one {old!r} in the definition to mutate"
    return text.replace(old, new)


def found(findings, where: str, what: str) -> bool:
    return any(where in f.where and what in str(f) for f in findings)


# ---------------------------------------------------------------------------------------------------
# Linters
# ---------------------------------------------------------------------------------------------------


def test_hadolint_is_clean_on_the_dockerfile():
    res = subprocess.run(
        [tool("hadolint"), "--no-color", str(REPO / "Dockerfile")], capture_output=True, text=True
    )
    assert res.returncode == 0 and res.stdout.strip() == "", res.stdout + res.stderr


def test_hadolint_is_live(tmp_path):
    # Common Dockerfile habits: an untagged base and unpinned apt packages. hadolint must object.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get update && apt-get install -y curl\n")
    res = subprocess.run([tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True)
    assert res.returncode != 0 and "DL3006" in res.stdout and "DL3008" in res.stdout, res.stdout


def unjustified_ignores(text: str) -> list[str]:
    """``# hadolint ignore=DL3008`` lines with no reason after the rule list."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*#\s*hadolint\s+ignore=(\S+)(.*)", line)
        if m and len(m.group(2).strip(" :-")) < 10:
            out.append(line.strip())
    return out


def test_every_hadolint_ignore_says_why():
    assert unjustified_ignores(DOCKERFILE) == []
    fabricated = (
        "# hadolint ignore=DL3008\n# hadolint ignore=DL3008 Ubuntu drops old builds from -updates\n"
    )
    assert unjustified_ignores(fabricated) == ["# hadolint ignore=DL3008"]


def shell_scripts() -> list[Path]:
    """Tracked and new (not ignored) files that are shell: *.sh, or a shell shebang."""
    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out = []
    for name in names:
        path = REPO / name
        if not path.is_file():
            continue
        if name.endswith(".sh"):
            out.append(path)
            continue
        with open(path, "rb") as f:
            first = f.readline(200)
        if re.match(rb"#!\s*(/usr/bin/env\s+)?(/bin/|/usr/bin/)?(ba|da|k)?sh\b", first):
            out.append(path)
    return sorted(out)


def definition_scripts(tmp_path: Path) -> list[Path]:
    """Each definition's %post, %test and %runscript as the scripts the build runs (bash: %post -c /bin/bash)."""
    out = []
    for profile, text in DEFINITIONS.items():
        d = singularitydef.parse_definition(text)
        for section in ("post", "test", "runscript"):
            path = tmp_path / f"singularity-{profile}-{section}.sh"
            # SC2154: the build runtime, not this script, defines variables such as OCTO_DIST_REVISION.
            path.write_text(
                "#!/bin/bash\n# shellcheck disable=SC2154\n" + "\n".join(d.sections[section]) + "\n"
            )
            out.append(path)
    return out


def test_shellcheck_is_clean_on_every_shell_script(tmp_path):
    scripts = shell_scripts()
    names = {p.relative_to(REPO).as_posix() for p in scripts}
    assert {"containers/install.sh", "containers/os-packages.sh"} <= names, names
    scripts += definition_scripts(tmp_path)
    res = subprocess.run(
        [tool("shellcheck"), "--format=gcc", *map(str, scripts)], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_shellcheck_is_live(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\nrm -rf $1/*\n")
    res = subprocess.run([tool("shellcheck"), str(bad)], capture_output=True, text=True)
    assert res.returncode != 0 and "SC2086" in res.stdout


# ---------------------------------------------------------------------------------------------------
# The definitions against env/ (octo_dist.stack.imagedefs), and against each other
# ---------------------------------------------------------------------------------------------------


def test_the_committed_definitions_agree_with_env():
    assert imagedefs.check_checkout(REPO) == []


def test_the_checker_sees_every_image_profile():
    # Non-vacuous: the checks above loop over these, so they must exist.
    assert {p.name for p in MANIFEST.profiles.values() if p.image_base} == {"cpu", *GPU_PROFILES}
    df = dockerfile.parse_dockerfile(DOCKERFILE)
    assert df.stage("cpu") and df.stage("cuda11") and df.stage("cuda12")
    assert imagecontract.definition_files(MANIFEST) == ["singularity.def", "singularity-cuda12.def"]


def test_a_gpu_profile_without_its_definition_is_reported(tmp_path):
    src = copy_definitions(tmp_path / "src")
    (src / "singularity-cuda12.def").unlink()
    findings = imagedefs.check_checkout(src)
    assert [str(f).splitlines()[0] for f in findings] == [
        "singularity-cuda12.def: found no such file; expected a Singularity definition for the cuda12 "
        "profile's image"
    ]


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_spython_parses_the_definition_like_the_checker_does(profile):
    from spython.main.parse.parsers import SingularityParser

    path = REPO / imagecontract.definition_file(profile)
    recipe = next(iter(SingularityParser(str(path)).recipe.values()))
    ours = singularitydef.parse_definition(DEFINITIONS[profile])
    cuda = MANIFEST.images[MANIFEST.profile(profile).image_base]
    assert recipe.fromHeader == ours.header["from"] == cuda.pinned
    env = dict(e.split("=", 1) for e in recipe.environ)
    assert env["PYTHONNOUSERSITE"] == "1" and env["OCTO_DIST_PROFILE"] == profile
    assert env["OCTO_DIST_MANIFEST"] == imagecontract.IMAGE_MANIFEST
    assert "LD_LIBRARY_PATH" not in env and "$PATH" in env["PATH"]
    assert {f.split()[0] for f in recipe.files} >= {
        "env",
        "containers",
        "octo_dist",
        "scripts",
        "pyproject.toml",
    }
    labels = dict(ln.split(None, 1) for ln in recipe.labels)
    assert labels["org.opencontainers.image.base.name"] == cuda.tagged
    assert labels["org.opencontainers.image.base.digest"] == cuda.digest
    assert re.match(r"exec \S*octo-dist \"\$@\"", recipe.cmd)
    post = "\n".join(recipe.install)
    assert f"containers/install.sh {profile} /opt/octo-dist/venv --require-git" in post
    assert labels[imagecontract.PROFILE_LABEL] == profile
    assert "octo-dist check-env --no-gpu" in "\n".join(ours.sections["test"])
    for section in imagecontract.SINGULARITY_SECTIONS:
        assert any(ln.strip() for ln in ours.sections[section]), section


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_singularity_and_docker_share_base_install_script_and_lock(profile):
    df = dockerfile.parse_dockerfile(DOCKERFILE)
    sif = singularitydef.parse_definition(DEFINITIONS[profile])
    base = MANIFEST.images[MANIFEST.profile(profile).image_base]
    assert dockerfile.target_base(df, profile) == sif.header["from"] == base.pinned
    assert dockerfile.target_base(df, "cpu") == MANIFEST.images["cpu"].pinned
    # Same script, same profile, hence the same lock: env/locks/<profile>-py3.10.txt (Ubuntu 22.04's python3).
    assert imagecontract.install_runs(dockerfile.target_runs(df, profile), profile)
    for other in {"cpu", *GPU_PROFILES} - {profile}:  # another build stage does not leak in
        assert not imagecontract.install_runs(dockerfile.target_runs(df, profile), other), other
        assert not imagecontract.install_runs(
            singularitydef.shell_body(sif.sections["post"]).splitlines(), other
        ), other
    assert imagecontract.install_runs(
        singularitydef.shell_body(sif.sections["post"]).splitlines(), profile
    )
    assert (REPO / f"env/locks/{profile}-py3.10.txt").is_file() and MANIFEST.profile(
        profile
    ).python == "3.10"


@pytest.mark.parametrize("profile", GPU_PROFILES)
def test_the_gpu_images_install_the_infiniband_userland_and_the_cpu_image_does_not(profile):
    df = dockerfile.parse_dockerfile(DOCKERFILE)
    sif = singularitydef.parse_definition(DEFINITIONS[profile])
    cuda_chain = [
        r for r in dockerfile.target_runs(df, profile) if imagecontract.INFINIBAND_RUN.search(r)
    ]
    assert cuda_chain and not [
        r for r in dockerfile.target_runs(df, "cpu") if imagecontract.INFINIBAND_RUN.search(r)
    ]
    assert imagecontract.INFINIBAND_RUN.search(singularitydef.shell_body(sif.sections["post"]))
    assert imagedefs.check_os_packages((REPO / "containers/os-packages.sh").read_text()) == []
    assert set(imagecontract.INFINIBAND_PACKAGES) == {
        "libibverbs1",
        "ibverbs-providers",
        "librdmacm1",
    }


def test_os_packages_without_a_verbs_package_is_reported():
    script = (REPO / "containers/os-packages.sh").read_text()
    findings = imagedefs.check_os_packages(
        mutate(script, "infiniband=(libibverbs1 ", "infiniband=(")
    )
    assert found(findings, "os-packages.sh", "libibverbs1"), findings
    assert found(
        imagedefs.check_os_packages("#!/bin/bash\n"), "os-packages.sh", "no infiniband=(...) array"
    )


def test_os_packages_script_takes_infiniband_and_refuses_anything_else(tmp_path):
    # Run it for real up to apt-get: a fake apt-get/dpkg-query records the package list.
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("apt-get", "dpkg-query"):
        (fake / name).write_text(f'#!/bin/bash\necho "{name} $*" >> {tmp_path}/calls\n')
        (fake / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}")
    script = str(REPO / "containers/os-packages.sh")
    subprocess.run(
        ["bash", script, "runtime", "--infiniband"], env=env, check=True, capture_output=True
    )
    installed = [
        ln
        for ln in (tmp_path / "calls").read_text().splitlines()
        if ln.startswith("apt-get install")
    ]
    assert installed and all(
        p in installed[0].split() for p in imagecontract.INFINIBAND_PACKAGES
    ), installed
    (tmp_path / "calls").unlink()
    subprocess.run(["bash", script, "runtime"], env=env, check=True, capture_output=True)
    assert "libibverbs1" not in (tmp_path / "calls").read_text()
    bad = subprocess.run(
        ["bash", script, "runtime", "--ib"], env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "usage" in bad.stderr


DOCKER_DRIFTS = {
    # name: (old text, new text, where the finding must be, what it must say)
    "FROM by tag": (
        "FROM ${CUDA11_BASE_REPO}@${CUDA11_BASE_DIGEST} AS os-cuda11",
        "FROM ${CUDA11_BASE_REPO}:${CUDA11_BASE_TAG} AS os-cuda11",
        "target cuda11",
        "base image",
    ),
    "target renamed": (
        "FROM os-cuda11 AS cuda11",
        "FROM os-cuda11 AS gpu",
        "target cuda11",
        "no stage named 'cuda11'",
    ),
    "profile env": (
        "ENV OCTO_DIST_PROFILE=cuda11",
        "ENV OCTO_DIST_PROFILE=cpu",
        "target cuda11",
        "OCTO_DIST_PROFILE",
    ),
    "install another profile": (
        "containers/install.sh cuda11",
        "containers/install.sh cpu",
        "target cuda11",
        "containers/install.sh cuda11",
    ),
    "root user": (
        "ENV OCTO_DIST_PROFILE=cpu \\\n    OCTO_DIST_MANIFEST=/opt/octo-dist/env/stack.toml \\\n"
        "    PATH=/opt/octo-dist/venv/bin:$PATH \\\n    PYTHONNOUSERSITE=1 \\\n    PYTHONUNBUFFERED=1\nUSER octo\n",
        "ENV OCTO_DIST_PROFILE=cpu \\\n    OCTO_DIST_MANIFEST=/opt/octo-dist/env/stack.toml \\\n"
        "    PATH=/opt/octo-dist/venv/bin:$PATH \\\n    PYTHONNOUSERSITE=1 \\\n    PYTHONUNBUFFERED=1\n",
        "target cpu",
        "non-root",
    ),
    "baked credential": (
        "ENV OCTO_DIST_PROFILE=cpu \\",
        "ENV WANDB_API_KEY=abc OCTO_DIST_PROFILE=cpu \\",
        "target cpu",
        "WANDB_API_KEY",
    ),
    "baked CA": (
        "ENV OCTO_DIST_PROFILE=cuda11 \\",
        "ENV PIP_CERT=/etc/ca.pem OCTO_DIST_PROFILE=cuda11 \\",
        "target cuda11",
        "PIP_CERT",
    ),
    "no InfiniBand in the GPU image": (
        "# nodes instead of TCP sockets.\nRUN bash /tmp/os-packages.sh runtime --infiniband",
        "# nodes instead of TCP sockets.\nRUN bash /tmp/os-packages.sh runtime",
        "target cuda11",
        "libibverbs1",
    ),
    "cuda12 on the cuda11 base": (
        "FROM os-cpu AS cuda12",
        "FROM os-cuda11 AS cuda12",
        "target cuda12",
        "env/stack.toml [images.cpu]",
    ),
    "cuda12 target missing": (
        "FROM os-cpu AS cuda12",
        "FROM os-cpu AS gpu12",
        "target cuda12",
        "no stage named 'cuda12'",
    ),
    "cuda12 installs the cuda11 lock": (
        "containers/install.sh cuda12",
        "containers/install.sh cuda11",
        "target cuda12",
        "containers/install.sh cuda12",
    ),
    "cuda12 profile env": (
        "ENV OCTO_DIST_PROFILE=cuda12",
        "ENV OCTO_DIST_PROFILE=cuda11",
        "target cuda12",
        "OCTO_DIST_PROFILE",
    ),
    "cuda12 profile label": (
        'io.github.octo-dist.profile="cuda12"',
        'io.github.octo-dist.profile="cuda11"',
        "target cuda12",
        "io.github.octo-dist.profile",
    ),
    "no InfiniBand in the cuda12 image": (
        "between nodes instead of TCP sockets.\nRUN bash /tmp/os-packages.sh runtime --infiniband",
        "between nodes instead of TCP sockets.\nRUN bash /tmp/os-packages.sh runtime",
        "target cuda12",
        "libibverbs1",
    ),
}


@pytest.mark.parametrize("name", DOCKER_DRIFTS)
def test_a_drifted_dockerfile_is_reported(name, tmp_path):
    old, new, where, what = DOCKER_DRIFTS[name]
    drifted = tmp_path / "Dockerfile"
    drifted.write_text(mutate(DOCKERFILE, old, new))
    findings = dockerfile.check_dockerfile(drifted.read_text(), MANIFEST)
    assert found(findings, where, what), "\n".join(map(str, findings)) or "no findings"


DEF_DRIFTS = {
    "user site": (
        "export PYTHONNOUSERSITE=1",
        "export PYTHONNOUSERSITE=0",
        "%environment",
        "PYTHONNOUSERSITE",
    ),
    "LD_LIBRARY_PATH": (
        "export PYTHONUNBUFFERED=1",
        "export LD_LIBRARY_PATH=/usr/local/cuda/lib64",
        "%environment",
        "LD_LIBRARY_PATH",
    ),
    "credential": (
        "export PYTHONUNBUFFERED=1",
        "export WANDB_API_KEY=abc",
        "%environment",
        "WANDB_API_KEY",
    ),
    "test needs a GPU": ("check-env --no-gpu", "check-env", "%test", "--no-gpu"),
    "git optional": (
        "/opt/octo-dist/venv --require-git",
        "/opt/octo-dist/venv --skip-git",
        "%post",
        "--require-git",
    ),
    "no env copied": ("    env /opt/octo-dist/env\n", "", "%files", "no env"),
    "no help": ("%help\n", "%comments\n", "%help", "no such section"),
    "no InfiniBand": (
        "os-packages.sh build --infiniband",
        "os-packages.sh build",
        "%post",
        "libibverbs1",
    ),
}


# The cuda11 drifts whose text is not about the cuda11 base, applied to the cuda12 definition as well, plus its own.
CUDA12_DEF_DRIFTS = {
    **{k: v for k, v in DEF_DRIFTS.items() if k != "profile"},
    "profile": (
        "export OCTO_DIST_PROFILE=cuda12",
        "export OCTO_DIST_PROFILE=cuda11",
        "%environment",
        "OCTO_DIST_PROFILE",
    ),
    "installs the cuda11 lock": (
        "install.sh cuda12 /opt",
        "install.sh cuda11 /opt",
        "%post",
        "install.sh cuda12",
    ),
    "label profile": (
        "io.github.octo-dist.profile cuda12",
        "io.github.octo-dist.profile cuda11",
        "%labels",
        "io.github.octo-dist.profile",
    ),
}
DRIFT_CASES = [("cuda11", n) for n in DEF_DRIFTS] + [("cuda12", n) for n in CUDA12_DEF_DRIFTS]


@pytest.mark.parametrize("profile,name", DRIFT_CASES)
def test_a_drifted_definition_is_reported(profile, name, tmp_path):
    old, new, where, what = (DEF_DRIFTS if profile == "cuda11" else CUDA12_DEF_DRIFTS)[name]
    drifted = tmp_path / imagecontract.definition_file(profile)
    drifted.write_text(mutate(DEFINITIONS[profile], old, new))
    findings = singularitydef.check_definition(drifted.read_text(), MANIFEST, profile)
    assert found(findings, where, what), "\n".join(map(str, findings)) or "no findings"
    assert all(f.where.startswith(imagecontract.definition_file(profile)) for f in findings)


PIN_EDITS = {
    # file: (a pinned line as committed, the same line edited by hand)
    "Dockerfile": ("ARG CUDA11_BASE_DIGEST=sha256:79e5", "ARG CUDA11_BASE_DIGEST=sha256:00e5"),
    "Dockerfile ": ("ARG CPU_BASE_TAG=22.04", "ARG CPU_BASE_TAG=24.04"),
    "Dockerfile  ": ("ARG VERSION=0.1.0", "ARG VERSION=0.0.9"),
    "singularity.def": (
        "From: docker.io/nvidia/cuda@sha256:79e5",
        "From: docker.io/nvidia/cuda@sha256:00e5",
    ),
    "singularity.def ": ("base.digest sha256:79e5", "base.digest sha256:00e5"),
    "singularity-cuda12.def": ("image.version 0.1.0", "image.version 0.0.9"),
}


@pytest.mark.parametrize("key", PIN_EDITS)
def test_a_hand_edited_pin_is_reported_and_rendering_restores_it(key, tmp_path):
    name = key.strip()
    old, new = PIN_EDITS[key]
    src = copy_definitions(tmp_path / "src")
    committed = (src / name).read_text()
    (src / name).write_text(mutate(committed, old, new))
    findings = imagedefs.check_checkout(src)
    assert [f.where for f in findings] == [name], "\n".join(map(str, findings))
    assert "make image-defs" in findings[0].fix and new.split("=")[-1] in findings[0].found
    assert imagecontract.render_checkout(src) == [name]
    assert (src / name).read_text() == committed and imagedefs.check_checkout(src) == []


def test_a_moved_pin_in_env_is_rendered_into_both_definitions(tmp_path):
    # The other direction: env/ moves on (a refreshed digest), the definitions follow by rendering alone.
    src = copy_definitions(tmp_path / "src")
    stack = src / "env" / "stack.toml"
    old = MANIFEST.images["cuda11"].digest
    stack.write_text(stack.read_text().replace(old, NEW_DIGEST))
    stale = imagedefs.check_checkout(src)
    assert {f.where for f in stale} == {"Dockerfile", "singularity.def"}, stale
    assert imagecontract.render_checkout(src) == ["Dockerfile", "singularity.def"]
    assert imagedefs.check_checkout(src) == []
    for name in ("Dockerfile", "singularity.def"):
        text = (src / name).read_text()
        assert NEW_DIGEST in text and old not in text, name
    assert MANIFEST.images["cpu"].digest in (src / "Dockerfile").read_text()


def test_the_committed_definitions_are_rendered_from_env():
    for name, profile in (
        ("Dockerfile", None),
        *((imagecontract.definition_file(p), p) for p in GPU_PROFILES),
    ):
        text = (REPO / name).read_text()
        assert imagecontract.render(text, MANIFEST, profile=profile) == text, (
            f"{name}: run make image-defs"
        )


def test_a_finding_says_what_was_found_expected_and_the_fix():
    text = mutate(DEFINITION, "export PYTHONNOUSERSITE=1", "export PYTHONNOUSERSITE=0")
    (finding,) = singularitydef.check_definition(text, MANIFEST)
    assert str(finding) == (
        "singularity.def %environment: found PYTHONNOUSERSITE='0'; expected '1'\n"
        "  fix: `export PYTHONNOUSERSITE=1` in %environment"
    )


def test_both_definitions_word_the_image_contracts_installs_alike():
    """The Dockerfile and the Singularity definition are checked by one function (``install_findings``): a GPU
    image without the InfiniBand userland reads the same in both, bar each one's own fix line."""
    docker = mutate(
        DOCKERFILE,
        "# nodes instead of TCP sockets.\nRUN bash /tmp/os-packages.sh runtime --infiniband",
        "# nodes instead of TCP sockets.\nRUN bash /tmp/os-packages.sh runtime",
    )
    sif = mutate(DEFINITION, "os-packages.sh build --infiniband", "os-packages.sh build")
    (in_docker,) = [
        f for f in dockerfile.check_dockerfile(docker, MANIFEST) if "InfiniBand" in f.expected
    ]
    (in_sif,) = singularitydef.check_definition(sif, MANIFEST)
    assert (in_docker.found, in_docker.expected) == (in_sif.found, in_sif.expected)
    assert in_docker.fix == "RUN bash /tmp/os-packages.sh runtime --infiniband"
    assert in_sif.fix == "bash /opt/octo-dist/containers/os-packages.sh build --infiniband"


def test_manifest_refuses_a_base_image_without_a_digest():
    data = copy.deepcopy(mf.loads(mf.DEFAULT_MANIFEST.read_text()))
    data["images"]["cuda11"]["digest"] = "11.8.0-base-ubuntu22.04"
    with pytest.raises(
        mf.ManifestError, match=r"images.cuda11.digest must be 'sha256:' and 64 hex, found '11.8.0"
    ):
        mf.parse_manifest(data, Path("stack.toml"))
    data["images"] = {"cpu": data["images"]["cpu"]}
    with pytest.raises(
        mf.ManifestError, match=r"image_base = 'cuda11', but there is no \[images.cuda11\]"
    ):
        mf.parse_manifest(data, Path("stack.toml"))


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies():
    rules = [
        ln.strip()
        for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert rules[0] == "*", "an allow-list: everything out, then what the build needs back in"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    df = dockerfile.parse_dockerfile(DOCKERFILE)
    copied = set()
    for stage in df.stages:
        for ins in stage.instructions:
            if ins.keyword in ("COPY", "ADD") and "--from=" not in ins.args:
                copied |= {w.split("/")[0] for w in ins.args.split()[:-1] if not w.startswith("--")}
    assert copied == allowed, f"COPY uses {sorted(copied)}, .dockerignore lets in {sorted(allowed)}"
    assert not {".venv", "wandb", "checkpoints", ".git"} & allowed


# ---------------------------------------------------------------------------------------------------
# make refresh-digests
# ---------------------------------------------------------------------------------------------------


def copy_definitions(dest: Path) -> Path:
    (dest / "env").mkdir(parents=True)
    shutil.copy(REPO / "env" / "stack.toml", dest / "env" / "stack.toml")
    shutil.copytree(REPO / "env" / "locks", dest / "env" / "locks")
    (dest / "containers").mkdir()
    for name in (
        "Dockerfile",
        "containers/os-packages.sh",
        *imagecontract.definition_files(MANIFEST),
    ):
        shutil.copy(REPO / name, dest / name)
    return dest


def test_refresh_digests_rewrites_env_and_every_definition(tmp_path):
    # The plain Ubuntu base moves: the cpu and cuda12 targets and singularity-cuda12.def follow it.
    src = copy_definitions(tmp_path / "src")
    old = MANIFEST.images["cpu"].digest
    asked = []

    def resolve(ref):
        asked.append(ref)
        return (
            NEW_DIGEST if ref == MANIFEST.images["cpu"].tagged else MANIFEST.images["cuda11"].digest
        )

    changes = digests.refresh_digests(src, resolve)
    assert changes == {old: NEW_DIGEST}
    assert sorted(asked) == sorted(
        i.tagged for i in MANIFEST.images.values()
    )  # asked by tag, not by the old digest
    for name in ("env/stack.toml", "Dockerfile", "singularity-cuda12.def"):
        text = (src / name).read_text()
        assert NEW_DIGEST in text and old not in text, name
    assert NEW_DIGEST not in (src / "singularity.def").read_text()  # the cuda11 base did not move
    assert imagedefs.check_checkout(src) == []


def test_refresh_digests_without_crane_or_skopeo_fails_clearly():
    with pytest.raises(
        digests.RefreshError,
        match="(?s)found neither crane nor skopeo.*fix: apt-get install skopeo",
    ):
        digests.registry_resolver(which=lambda name: None)


def test_refresh_digests_with_no_registry_names_the_failure(tmp_path):
    # A stand-in skopeo that fails the way an offline one does.
    fake = tmp_path / "skopeo"
    fake.write_text(
        "#!/bin/sh\necho 'pinging container registry registry-1.docker.io: no such host' >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    resolve = digests.registry_resolver(which=lambda name: str(fake) if name == "skopeo" else None)
    with pytest.raises(
        digests.RefreshError,
        match=r"could not resolve docker.io/nvidia/cuda:11.8.0-base-ubuntu22.04: "
        r".*no such host\n  expected: a registry reachable",
    ):
        resolve(MANIFEST.images["cuda11"].tagged)


def test_skopeo_digest_is_the_hash_of_the_manifest_as_served():
    assert (
        digests.manifest_digest(b"{}")
        == "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    )


def test_make_refresh_digests_fails_clearly_here():
    # No crane/skopeo/registry on CI: the target must say so rather than leave stale pins looking fresh.
    if shutil.which("crane") or shutil.which("skopeo"):
        pytest.skip(
            "crane or skopeo is installed here; the offline failure is covered by the fake-skopeo test"
        )
    res = subprocess.run(
        ["make", "--no-print-directory", "refresh-digests", f"PYTHON={sys.executable}"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert (
        res.returncode != 0
        and "error: refresh-digests found neither crane nor skopeo" in res.stderr
    )
    assert "Traceback" not in res.stderr


# ---------------------------------------------------------------------------------------------------
# containers/install.sh, run for real into a temporary prefix (cpu profile, git deps skipped)
# ---------------------------------------------------------------------------------------------------


def build_context(dest: Path) -> Path:
    """What the Dockerfile's build stage copies (the .dockerignore allow-list), nothing else."""
    rules = (REPO / ".dockerignore").read_text().split()
    dest.mkdir(parents=True)
    for name in (r[1:].rstrip("/") for r in rules if r.startswith("!")):
        src = REPO / name
        if src.is_dir():
            shutil.copytree(
                src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def offline_prefix(tmp_path_factory):
    """A venv whose base packages are this venv's: pip finds every lock line already installed at its pinned
    version, so the real script runs offline in seconds. (The full download, hashes checked, is the buildah test.)"""
    prefix = tmp_path_factory.mktemp("prefix") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    site = subprocess.run(
        [
            str(prefix / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = subprocess.run(
        [sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "octo-dist-test-overlay.pth").write_text(ours + "\n")
    return prefix


def run_install(src: Path, prefix: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", mf.MANIFEST_ENV, mf.PROFILE_ENV)
    }
    return subprocess.run(
        ["bash", str(src / "containers" / "install.sh"), "cpu", str(prefix), *args],
        env={**base, "PYTHON": sys.executable, **env},
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def test_install_script_builds_a_working_prefix_from_the_build_context(offline_prefix, tmp_path):
    src = build_context(tmp_path / "src")
    res = run_install(
        src, offline_prefix, "--skip-git", OCTO_DIST_CA=str(tmp_path / "no-such-ca.pem")
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    py = "%d.%d" % sys.version_info[:2]
    assert f"installing profile 'cpu' for Python {py} from env/locks/cpu-py{py}.txt" in res.stdout
    lock_hash = subprocess.run(
        ["sha256sum", str(src / f"env/locks/cpu-py{py}.txt")], capture_output=True, text=True
    ).stdout
    assert lock_hash.split()[0] in res.stdout  # which lock, by content, in the build log
    assert "--- pip freeze ---" in res.stdout and "jax==0.4.22" in res.stdout
    assert "no-such-ca.pem is missing or empty; using the default CA bundle" in res.stderr
    # octo-dist itself went into the prefix (not editable), from the copied build context.
    direct = next(
        offline_prefix.glob("lib/python*/site-packages/octo_dist-*.dist-info/direct_url.json")
    )
    assert json.loads(direct.read_text())["url"] == src.as_uri()
    exe = offline_prefix / "bin" / "octo-dist"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", mf.PROFILE_ENV)}
    # Installed (not editable), octo-dist finds env/ only where the images point it: OCTO_DIST_MANIFEST.
    lost = subprocess.run(
        [str(exe), "check-env", "--profile", "cpu"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**env, mf.MANIFEST_ENV: ""},
    )
    assert lost.returncode == 2 and "no manifest at" in lost.stderr
    res = subprocess.run(
        [str(exe), "check-env", "--profile", "cpu", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**env, mf.MANIFEST_ENV: str(src / "env" / "stack.toml")},
    )
    report = json.loads(res.stdout)
    # git.* depend on what this machine's venv holds (GitHub is unreachable here); every other check must pass.
    failing = [
        c for c in report["checks"] if c["status"] == "fail" and not c["id"].startswith("git.")
    ]
    assert report["profile"] == "cpu" and any(c["id"] == "pin.jax" for c in report["checks"])
    assert failing == [], failing


def test_install_script_refuses_an_unpinned_git_dependency(offline_prefix, tmp_path):
    src = build_context(tmp_path / "src")
    stack = src / "env" / "stack.toml"
    stack.write_text(
        mutate(
            stack.read_text(),
            'commit = "b14ec77d15ac30137c95b847f7fbaaf56f7eee8b"',
            'commit = "main"',
        )
    )
    res = run_install(
        src, offline_prefix, "--skip-git"
    )  # even skipped, an unpinned one stops the build
    assert res.returncode == 2  # a manifest the build refuses: a usage error
    assert "git.octo.commit must be a full 40-hex commit SHA, found 'main'" in res.stderr
    assert "--- pip freeze ---" not in res.stdout


def test_the_gpu_images_verify_at_build_time_that_verbs_load(tmp_path):
    """The build-time line of the GPU targets and the .sifs' %test, run here against a libibverbs built with gcc."""
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    df = dockerfile.parse_dockerfile(DOCKERFILE)
    docker = {r for p in GPU_PROFILES for r in dockerfile.target_runs(df, p) if "load_verbs" in r}
    sif = {
        ln.strip()
        for p in GPU_PROFILES
        for ln in singularitydef.parse_definition(DEFINITIONS[p]).sections["test"]
        if "load_verbs" in ln
    }
    assert len(docker) == 1 and docker == sif
    assert all(
        len([r for r in dockerfile.target_runs(df, p) if "load_verbs" in r]) == 1
        for p in GPU_PROFILES
    )
    docker = sorted(docker)
    assert not [r for r in dockerfile.target_runs(df, "cpu") if "load_verbs" in r]
    command = docker[0].replace("/opt/octo-dist/venv/bin/python", sys.executable)
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "verbs.c").write_text("void **ibv_get_device_list(int *n) { return 0; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(lib / "libibverbs.so.1"), str(tmp_path / "verbs.c")],
        check=True,
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ok = subprocess.run(
        ["bash", "-c", command],
        env=dict(env, LD_LIBRARY_PATH=str(lib)),
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stderr
    from octo_dist.envcheck import transport

    if transport.load_verbs() is None:
        return  # this host has rdma-core itself: the failing case cannot be fabricated by hiding a directory
    missing = subprocess.run(
        ["bash", "-c", command],
        env=dict(env, LD_LIBRARY_PATH=str(tmp_path / "none")),
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and "libibverbs.so.1" in missing.stderr


def test_the_cuda12_images_pull_no_cuda_base_image():
    # jax[cuda12] brings every CUDA library as a wheel; only the driver comes from the host (--nv, --gpus).
    df = dockerfile.parse_dockerfile(DOCKERFILE)
    assert dockerfile.target_base(df, "cuda12") == dockerfile.target_base(df, "cpu")
    assert (
        "nvidia/cuda" not in singularitydef.parse_definition(DEFINITIONS["cuda12"]).header["from"]
    )
    assert "LD_LIBRARY_PATH" not in singularitydef.shell_body(
        singularitydef.parse_definition(DEFINITIONS["cuda12"]).sections["environment"]
    )
