"""The container definitions (``Dockerfile``, ``singularity.def``, ``singularity-cuda12.def``) checked against
env/stack.toml.

Both definitions pin their base image and run ``containers/install.sh`` for a profile; env/ is the
one place those pins are decided. This module reads the definitions as text and reports every place
where they disagree with the manifest or drop something the images promise (non-root user, the
profile in the environment, no baked secrets, ``PYTHONNOUSERSITE=1`` ...). It is pure over file text
and a :class:`~octo_dist.stack.manifest.Manifest`, so tests fabricate a drifted copy and see it reported.

``python -m octo_dist.stack.imagedefs check`` runs it on the checkout (``make docker`` and ``make sif`` do so
before building); ``python -m octo_dist.stack.imagedefs refresh-digests`` re-resolves the base digests where
a registry is reachable (``make refresh-digests``).

Conventions the checks rely on, written in both definitions:

* Dockerfile: global ``ARG <KEY>_BASE_REPO / _TAG / _DIGEST`` per ``[images.<key>]`` (``CUDA11_BASE_DIGEST``),
  a final stage named after each profile (``--target cuda11``), ``FROM <repo>@<digest>`` (no engine but
  Docker accepts a tag and a digest in one reference, so the tag travels in a label).
* one Singularity definition per GPU profile (:func:`definition_file`): ``singularity.def`` for ``cuda11`` (the
  first, whose name ``make sif`` and the README have always used), ``singularity-<profile>.def`` for the others
  (``singularity-cuda12.def``); each has ``From: <repo>@<digest>`` and the same labels.
* GPU images (the ``cuda11``/``cuda12`` targets, the definitions) run
  ``containers/os-packages.sh ... --infiniband``, whose ``infiniband=(...)`` array holds :data:`INFINIBAND_PACKAGES`:
  without rdma-core's userland NCCL uses TCP sockets.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

from octo_dist import EXIT_FAILED, EXIT_USAGE, __version__
from octo_dist.problems import Problem
from octo_dist.stack import manifest as mf

DOCKERFILE = "Dockerfile"
SINGULARITY_DEF = (
    "singularity.def"  # the cuda11 image's; other GPU profiles: singularity-<profile>.def
)
FIRST_GPU_PROFILE = "cuda11"
INSTALL_SCRIPT = "containers/install.sh"
OS_PACKAGES_SCRIPT = "containers/os-packages.sh"
# rdma-core's userland, from the OS: NCCL dlopens libibverbs.so.1, which loads the mlx5 provider from
# ibverbs-providers; librdmacm1 for RDMA connection management. Without them NCCL logs `NET/IB : No device
# found` and all-reduces over TCP sockets between nodes. Every GPU image installs them.
INFINIBAND_PACKAGES = ("libibverbs1", "ibverbs-providers", "librdmacm1")
INFINIBAND_RUN = re.compile(r"os-packages\.sh\s+(build|runtime)\s+--infiniband\b")
IMAGE_PREFIX = "/opt/octo-dist"  # venv, env/ and (build only) the source live here
IMAGE_MANIFEST = (
    f"{IMAGE_PREFIX}/env/stack.toml"  # what OCTO_DIST_MANIFEST points at in every image
)
PROFILE_LABEL = "io.github.octo-dist.profile"
REQUIRED_LABELS = (
    "org.opencontainers.image.source",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.version",
    "org.opencontainers.image.base.name",
    "org.opencontainers.image.base.digest",
    PROFILE_LABEL,
)
# Names that must never be set at build time: credentials come in with `docker run -e` / SINGULARITYENV_.
SECRET_NAME = re.compile(
    r"(API_KEY|TOKEN|PASSWORD|SECRET)$|^(PIP_CERT|SSL_CERT_FILE|REQUESTS_CA_BUNDLE|GIT_SSL_CAINFO)$"
)
SINGULARITY_SECTIONS = ("files", "post", "environment", "runscript", "test", "labels", "help")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One disagreement: where, what was found, what env/ or the image contract expects, how to fix it."""

    where: str  # "Dockerfile target cuda11" / "singularity.def %environment"
    found: str
    expected: str
    fix: str

    def __str__(self) -> str:
        return f"{self.where}: found {self.found}; expected {self.expected}\n  fix: {self.fix}"


# ---------------------------------------------------------------------------------------------------
# The pins, rendered from env/stack.toml into the definitions (make image-defs)
# ---------------------------------------------------------------------------------------------------

RENDER_FIX = (
    "make image-defs (writes every pin from env/stack.toml [images] and octo_dist.__version__)"
)


def pinned_lines(
    manifest: mf.Manifest, version: str, profile: Optional[str] = None
) -> list[tuple[re.Pattern, str]]:
    """Each pinned line of a definition: the pattern that finds it and the line env/ says it must be.

    ``profile=None`` is the Dockerfile (``ARG CUDA11_BASE_DIGEST=sha256:...`` per image, ``ARG VERSION=0.1.0``);
    a GPU profile is its Singularity definition (``From: docker.io/nvidia/cuda@sha256:...`` and the labels
    ``org.opencontainers.image.base.name/base.digest/version``, indented as written).
    """
    if profile is None:
        out = [(re.compile(r"^ARG VERSION=.*$", re.M), f"ARG VERSION={version}")]
        for image in manifest.images.values():
            key = image.name.upper().replace("-", "_")
            for suffix, value in (
                ("REPO", image.repository),
                ("TAG", image.tag),
                ("DIGEST", image.digest),
            ):
                out.append(
                    (
                        re.compile(rf"^ARG {key}_BASE_{suffix}=.*$", re.M),
                        f"ARG {key}_BASE_{suffix}={value}",
                    )
                )
        return out
    image = manifest.images[manifest.profile(profile).image_base]
    out = [(re.compile(r"^From: .*$", re.M), f"From: {image.pinned}")]
    for label, value in (
        ("base.name", image.tagged),
        ("base.digest", image.digest),
        ("version", version),
    ):
        name = f"org.opencontainers.image.{label}"
        out.append((re.compile(rf"^(\s+){re.escape(name)} .*$", re.M), rf"\g<1>{name} {value}"))
    return out


def render(
    text: str, manifest: mf.Manifest, version: str = __version__, profile: Optional[str] = None
) -> str:
    """The definition with every pinned line (:func:`pinned_lines`) as env/stack.toml says; the rest untouched."""
    for pattern, line in pinned_lines(manifest, version, profile):
        text = pattern.sub(line, text, count=1)
    return text


def stale_pins(
    where: str, text: str, manifest: mf.Manifest, version: str, profile: Optional[str] = None
) -> list[Finding]:
    """One finding per pinned line that is missing or not what :func:`render` writes."""
    findings = []
    for pattern, line in pinned_lines(manifest, version, profile):
        m = pattern.search(text)
        want = pattern.sub(line, m.group(0)) if m else line.replace("\\g<1>", "    ")
        if m is None or m.group(0) != want:
            findings.append(
                Finding(
                    where,
                    repr(m.group(0).strip()) if m else f"no line like {want.strip()!r}",
                    f"{want.strip()!r} (env/stack.toml [images], octo_dist.__version__)",
                    RENDER_FIX,
                )
            )
    return findings


def render_checkout(source: Path = mf.REPO_ROOT, version: str = __version__) -> list[str]:
    """Rewrite the pins of the Dockerfile and every GPU profile's definition; return the files changed."""
    manifest = mf.load_manifest(source / "env" / "stack.toml")
    changed = []
    gpu = [p.name for p in manifest.profiles.values() if p.image_base and p.gpu]
    for name, profile in ((DOCKERFILE, None), *((definition_file(p), p) for p in gpu)):
        path = source / name
        if not path.is_file():
            continue
        text = path.read_text()
        new = render(text, manifest, version, profile)
        if new != text:
            path.write_text(new)
            changed.append(name)
    return changed


# ---------------------------------------------------------------------------------------------------
# Dockerfile
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Instruction:
    keyword: str  # "RUN", upper case
    args: str  # the rest of the logical line, continuations joined: "--mount=type=secret,id=ca ..."


@dataclasses.dataclass(frozen=True)
class Stage:
    base: str  # as written: "${CUDA11_BASE_REPO}@${CUDA11_BASE_DIGEST}" or an earlier stage's name
    name: str  # "cuda11"; "" when unnamed
    instructions: tuple[Instruction, ...]


@dataclasses.dataclass(frozen=True)
class Dockerfile:
    args: Mapping[
        str, str
    ]  # global ARG defaults, before the first FROM: {"CUDA11_BASE_TAG": "11.8.0-..."}
    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Optional[Stage]:
        return next((s for s in self.stages if s.name == name), None)


def target_base(df: Dockerfile, target: str) -> str:
    """The external image target ``cuda11`` is built on, ARGs substituted: ``docker.io/nvidia/cuda@sha256:...``."""
    return substitute(_chain(df, target)[1], df.args)


def target_runs(df: Dockerfile, target: str) -> list[str]:
    """Every RUN whose output can reach ``target`` (its stages and those it ``COPY --from``s)."""
    return [i.args for s in _reachable(df, target) for i in s.instructions if i.keyword == "RUN"]


def _logical_lines(text: str) -> list[str]:
    """Join ``\\`` continuations and drop comments and blank lines (comment lines inside a RUN included)."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not cur):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        out.append((cur + line).strip())
        cur = ""
    if cur.strip():
        out.append(cur.strip())
    return out


def parse_dockerfile(text: str) -> Dockerfile:
    """Split a Dockerfile into global ARG defaults and stages (enough for the checks; not a full parser)."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    cur: Optional[tuple[str, str, list]] = None
    for line in _logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            if cur:
                stages.append(Stage(cur[0], cur[1], tuple(cur[2])))
            words = [w for w in rest.split() if not w.startswith("--platform")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else ""
            cur = (words[0], name, [])
        elif cur is None:
            if keyword == "ARG":
                key, _, default = rest.partition("=")
                args[key.strip()] = default.strip().strip('"')
        else:
            cur[2].append(Instruction(keyword, rest))
    if cur:
        stages.append(Stage(cur[0], cur[1], tuple(cur[2])))
    return Dockerfile(args=args, stages=tuple(stages))


def substitute(value: str, variables: Mapping[str, str]) -> str:
    """``${X}`` and ``$X`` from ``variables``; unknown ones stay as written (so a finding shows them)."""
    return re.sub(
        r"\$\{(\w+)\}|\$(\w+)", lambda m: variables.get(m.group(1) or m.group(2), m.group(0)), value
    )


def _chain(df: Dockerfile, name: str) -> tuple[list[Stage], str]:
    """The stages from ``name`` down to its external base, and that base as written."""
    chain, seen, stage = [], set(), df.stage(name)
    while stage is not None and stage.name not in seen:
        seen.add(stage.name)
        chain.append(stage)
        parent = df.stage(stage.base)
        if parent is None:
            return chain, stage.base
        stage = parent
    return chain, ""


def _reachable(df: Dockerfile, name: str) -> list[Stage]:
    """Every stage whose output can end up in target ``name``: its chain and what ``COPY --from`` pulls in."""
    out: list[Stage] = []
    todo = [name]
    while todo:
        for stage in _chain(df, todo.pop())[0]:
            if stage in out:
                continue
            out.append(stage)
            for ins in stage.instructions:
                m = re.search(r"--from=(\S+)", ins.args) if ins.keyword == "COPY" else None
                if m and df.stage(m.group(1)):
                    todo.append(m.group(1))
    return out


def _key_values(args: str) -> dict[str, str]:
    """``LABEL a=1 "b"="two words"`` / ``ENV A=1 B=2`` -> dict (the legacy ``ENV A 1`` form too)."""
    words = shlex.split(args)
    if len(words) >= 2 and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words if "=" in w)


def _env_of(stages: Iterable[Stage], keyword: str) -> dict[str, str]:
    merged: dict[str, str] = {}
    for stage in reversed(list(stages)):  # base first, so the target's own value wins
        for ins in stage.instructions:
            if ins.keyword == keyword:
                merged.update(_key_values(ins.args))
    return merged


def install_runs(commands: Iterable[str], profile: str) -> list[str]:
    """The commands that run ``containers/install.sh <profile> ...``."""
    pat = re.compile(r"(^|[\s/])" + re.escape(INSTALL_SCRIPT) + r"\s+" + re.escape(profile) + r"\s")
    return [c for c in commands if pat.search(c + " ")]


def check_dockerfile(text: str, manifest: mf.Manifest, version: str = __version__) -> list[Finding]:
    """Every disagreement between a Dockerfile's targets and the manifest's image profiles.

    Args:
        text: the Dockerfile.
        manifest: env/stack.toml, parsed.
        version: octo-dist's version, which the ``VERSION`` default (the version label) must equal.
    """
    df = parse_dockerfile(text)
    findings = stale_pins(DOCKERFILE, text, manifest, version)
    pinned_args = parse_dockerfile(render(text, manifest, version)).args
    for profile in (p for p in manifest.profiles.values() if p.image_base):
        findings += _check_target(df, profile, manifest.images[profile.image_base], pinned_args)
    return findings


def _check_target(
    df: Dockerfile, profile: mf.Profile, image: mf.BaseImage, pinned_args: Mapping[str, str]
) -> list[Finding]:
    """The findings of one profile's ``--target``: its stage, base image, environment, labels, install, user,
    command and build-time secrets, in that order."""
    where = f"{DOCKERFILE} target {profile.name}"
    if df.stage(profile.name) is None:
        return [
            Finding(
                where,
                f"no stage named {profile.name!r} (stages: "
                f"{', '.join(s.name for s in df.stages if s.name) or 'none'})",
                f"a final stage `FROM ... AS {profile.name}` for `--target {profile.name}`",
                f"add the stage; `make docker PROFILE={profile.name}` builds it",
            )
        ]
    chain, base = _chain(df, profile.name)
    findings = []
    # With the ARGs as rendered: a stale ARG is stale_pins' finding; this one is a FROM on the wrong ARGs.
    resolved = substitute(base, pinned_args)
    if resolved != image.pinned:
        findings.append(
            Finding(
                where,
                f"base image {base!r} = {resolved!r}",
                f"{image.pinned!r} (env/stack.toml [images.{image.name}])",
                RENDER_FIX,
            )
        )
    findings += _target_env(where, chain, profile)
    findings += _target_labels(where, df, chain, profile)
    findings += _target_installs(where, df, chain, profile)
    findings += _target_user_and_command(where, chain)
    findings += _target_secrets(where, _reachable(df, profile.name))
    return findings


def _target_env(where: str, chain: list[Stage], profile: mf.Profile) -> list[Finding]:
    """The profile and the manifest's path in the target's environment."""
    env = _env_of(chain, "ENV")
    findings = []
    if env.get(mf.PROFILE_ENV) != profile.name:
        findings.append(
            Finding(
                where,
                f"ENV {mf.PROFILE_ENV}={env.get(mf.PROFILE_ENV)!r}",
                repr(profile.name),
                f"`ENV {mf.PROFILE_ENV}={profile.name}` in the {profile.name} stage",
            )
        )
    if env.get(mf.MANIFEST_ENV) != IMAGE_MANIFEST:
        findings.append(
            Finding(
                where,
                f"ENV {mf.MANIFEST_ENV}={env.get(mf.MANIFEST_ENV)!r}",
                repr(IMAGE_MANIFEST),
                f"COPY env/ to {IMAGE_PREFIX}/env and set `ENV {mf.MANIFEST_ENV}={IMAGE_MANIFEST}`",
            )
        )
    return findings


def _target_labels(
    where: str, df: Dockerfile, chain: list[Stage], profile: mf.Profile
) -> list[Finding]:
    """The OCI labels and the profile label, ARGs substituted."""
    labels = {k: substitute(v, df.args) for k, v in _env_of(chain, "LABEL").items()}
    findings = []
    for label in REQUIRED_LABELS:
        if label not in labels:
            findings.append(
                Finding(
                    where,
                    f"no LABEL {label}",
                    "the OCI labels source, revision, version, "
                    "base.name, base.digest and the profile",
                    f"add `LABEL {label}=...`",
                )
            )
    if labels.get(PROFILE_LABEL, profile.name) != profile.name:
        findings.append(
            Finding(
                where,
                f"LABEL {PROFILE_LABEL}={labels[PROFILE_LABEL]!r}",
                repr(profile.name),
                f'LABEL {PROFILE_LABEL}="{profile.name}"',
            )
        )
    return findings


def _target_installs(
    where: str, df: Dockerfile, chain: list[Stage], profile: mf.Profile
) -> list[Finding]:
    """The install script's RUN for the profile and, in a GPU image, the InfiniBand userland's."""
    findings = []
    if not install_runs(target_runs(df, profile.name), profile.name):
        findings.append(
            Finding(
                where,
                f"no RUN of `{INSTALL_SCRIPT} {profile.name} ...` in its stages",
                "the one install script, for this target's profile",
                f"RUN {INSTALL_SCRIPT} {profile.name} {IMAGE_PREFIX}/venv --require-git",
            )
        )
    if profile.gpu and not any(
        INFINIBAND_RUN.search(i.args) for s in chain for i in s.instructions if i.keyword == "RUN"
    ):
        findings.append(
            Finding(
                where,
                "no RUN of `os-packages.sh runtime --infiniband` in its stages",
                f"the InfiniBand userland ({', '.join(INFINIBAND_PACKAGES)}) in a GPU image, "
                "else NCCL runs over TCP sockets between nodes",
                "RUN bash /tmp/os-packages.sh runtime --infiniband",
            )
        )
    return findings


def _target_user_and_command(where: str, chain: list[Stage]) -> list[Finding]:
    """A non-root final user, and ``check-env`` as the command."""
    findings = []
    users = [
        i.args.split(":")[0].strip()
        for s in reversed(chain)
        for i in s.instructions
        if i.keyword == "USER"
    ]
    if not users or users[-1] in ("root", "0"):
        findings.append(
            Finding(
                where,
                f"USER {users[-1] if users else '(none: root)'}",
                "a non-root user",
                "`USER octo` after the install, in the final stage",
            )
        )
    cmds = [i.args for s in chain for i in s.instructions if i.keyword == "CMD"]
    if not cmds or not re.search(r"octo-dist\W+check-env", cmds[0]):
        findings.append(
            Finding(
                where,
                f"CMD {cmds[0] if cmds else '(none)'}",
                '["octo-dist", "check-env"]',
                'CMD ["octo-dist", "check-env"]',
            )
        )
    return findings


def _target_secrets(where: str, reach: list[Stage]) -> list[Finding]:
    """ENV or ARG names of credentials in any stage whose output reaches the target."""
    findings = []
    for stage in reach:
        for ins in stage.instructions:
            if ins.keyword not in ("ENV", "ARG"):
                continue
            names = (
                _key_values(ins.args)
                if ins.keyword == "ENV"
                else {ins.args.split("=")[0].strip(): ""}
            )
            for name in names:
                if SECRET_NAME.search(name):
                    findings.append(
                        Finding(
                            f"{where} (stage {stage.name or stage.base})",
                            f"{ins.keyword} {name}",
                            "no credential or CA set at build time",
                            "pass it at run time (docker run -e, SINGULARITYENV_...) or as a "
                            "build secret (RUN --mount=type=secret,id=ca)",
                        )
                    )
    return findings


# ---------------------------------------------------------------------------------------------------
# singularity.def
# ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Definition:
    header: Mapping[str, str]  # {"bootstrap": "docker", "from": "docker.io/nvidia/cuda@sha256:..."}
    sections: Mapping[str, list[str]]  # "post" -> its lines, as written


def parse_definition(text: str) -> Definition:
    """Header keywords and ``%section`` bodies of a Singularity/Apptainer definition (one stage)."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current: Optional[str] = None
    for line in text.splitlines():
        m = re.match(r"%(\w+)", line)
        if m:
            current = m.group(1).lower()
            sections.setdefault(current, [])
        elif current is not None:
            sections[current].append(line)
        elif ":" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition(":")
            header[key.strip().lower()] = value.split("#", 1)[0].strip()
    return Definition(header=header, sections=sections)


def shell_body(lines: Sequence[str]) -> str:
    """Section text without comment lines, continuations joined (what a shell would run)."""
    return "\n".join(_logical_lines("\n".join(lines)))


def definition_file(profile: str) -> str:
    """The Singularity definition of a GPU profile's image: ``"cuda11"`` -> ``"singularity.def"``,
    ``"cuda12"`` -> ``"singularity-cuda12.def"``."""
    return SINGULARITY_DEF if profile == FIRST_GPU_PROFILE else f"singularity-{profile}.def"


def check_definition(
    text: str,
    manifest: mf.Manifest,
    profile_name: str = "cuda11",
    version: str = __version__,
) -> list[Finding]:
    """Every disagreement between a Singularity definition and the manifest's ``profile_name`` (a GPU image)."""
    d = parse_definition(text)
    profile = manifest.profile(profile_name)
    w = definition_file(profile_name)
    findings = stale_pins(w, text, manifest, version, profile_name)
    findings += _definition_layout(w, d)
    findings += _definition_post(w, d, profile)
    findings += _definition_environment(w, d, profile)
    findings += _definition_run_and_test(w, d)
    findings += _definition_labels(w, d, profile)
    return findings


def _definition_layout(w: str, d: Definition) -> list[Finding]:
    """The docker bootstrap, every section, and the source trees copied in under %files."""
    findings = []
    if d.header.get("bootstrap", "").lower() != "docker":
        findings.append(
            Finding(
                f"{w} header",
                f"Bootstrap: {d.header.get('bootstrap')!r}",
                "'docker'",
                "Bootstrap: docker",
            )
        )
    for section in SINGULARITY_SECTIONS:
        if not [ln for ln in d.sections.get(section, []) if ln.strip()]:
            findings.append(
                Finding(
                    f"{w} %{section}",
                    "no such section, or an empty one",
                    f"every one of %{', %'.join(SINGULARITY_SECTIONS)}",
                    f"add %{section}",
                )
            )
    files = {
        ln.split()[0].rstrip("/")
        for ln in d.sections.get("files", [])
        if ln.strip() and not ln.strip().startswith("#")
    }
    for needed in ("env", "containers", "octo_dist", "scripts", "pyproject.toml"):
        if needed not in files:
            findings.append(
                Finding(
                    f"{w} %files",
                    f"no {needed}",
                    "env/, containers/, octo_dist/, scripts/ and "
                    "pyproject.toml copied in (the install script installs from them)",
                    f"`{needed} {IMAGE_PREFIX}/{needed}` under %files",
                )
            )
    return findings


def _definition_post(w: str, d: Definition, profile: mf.Profile) -> list[Finding]:
    """%post runs the install script for the profile (``--require-git``) and, for a GPU, the InfiniBand packages."""
    findings = []
    post = shell_body(d.sections.get("post", []))
    installs = install_runs(post.splitlines(), profile.name)
    if not installs:
        findings.append(
            Finding(
                f"{w} %post",
                f"no `{INSTALL_SCRIPT} {profile.name} ...`",
                "the one install script, for the GPU profile",
                f"{IMAGE_PREFIX}/{INSTALL_SCRIPT} {profile.name} {IMAGE_PREFIX}/venv --require-git",
            )
        )
    elif not all("--require-git" in c for c in installs):
        findings.append(
            Finding(
                f"{w} %post",
                installs[0],
                "--require-git (an image without octo is not an image)",
                "add --require-git",
            )
        )
    if profile.gpu and not INFINIBAND_RUN.search(post):
        findings.append(
            Finding(
                f"{w} %post",
                "no `os-packages.sh build --infiniband`",
                f"the InfiniBand userland ({', '.join(INFINIBAND_PACKAGES)}) in a GPU image, "
                "else NCCL runs over TCP sockets between nodes",
                f"bash {IMAGE_PREFIX}/{OS_PACKAGES_SCRIPT} build --infiniband",
            )
        )
    return findings


def _definition_environment(w: str, d: Definition, profile: mf.Profile) -> list[Finding]:
    """%environment sets the profile, ``PYTHONNOUSERSITE`` and the manifest; no ``LD_LIBRARY_PATH``, no secret."""
    findings = []
    env_body = shell_body(d.sections.get("environment", []))
    env = dict(re.findall(r"(?:export\s+)?(\w+)=(\S*)", env_body))
    for name, want in (
        (mf.PROFILE_ENV, profile.name),
        ("PYTHONNOUSERSITE", "1"),
        (mf.MANIFEST_ENV, IMAGE_MANIFEST),
    ):
        if env.get(name, "").strip("\"'") != want:
            findings.append(
                Finding(
                    f"{w} %environment",
                    f"{name}={env.get(name)!r}",
                    repr(want),
                    f"`export {name}={want}` in %environment",
                )
            )
    # --nv binds the host driver's libraries and points LD_LIBRARY_PATH at them; overwriting it here hides them.
    if "LD_LIBRARY_PATH" in env:
        findings.append(
            Finding(
                f"{w} %environment",
                f"LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}",
                "no LD_LIBRARY_PATH (singularity --nv sets it to the bound driver libraries)",
                "remove it; the CUDA libraries come from the nvidia-*-cu11/-cu12 wheels, found by jaxlib",
            )
        )
    for name in env:
        if SECRET_NAME.search(name):
            findings.append(
                Finding(
                    f"{w} %environment",
                    name,
                    "no credentials in the image",
                    f"pass it at run time: SINGULARITYENV_{name}=... or --env-file",
                )
            )
    return findings


def _definition_run_and_test(w: str, d: Definition) -> list[Finding]:
    """%runscript execs ``octo-dist``; %test runs ``check-env --no-gpu``."""
    findings = []
    runscript = shell_body(d.sections.get("runscript", []))
    if not re.search(r"\bexec\b.*\bocto-dist\b", runscript):
        findings.append(
            Finding(
                f"{w} %runscript", repr(runscript), '`exec octo-dist "$@"`', 'exec octo-dist "$@"'
            )
        )
    test = shell_body(d.sections.get("test", []))
    if not re.search(r"octo-dist\s+check-env\b.*--no-gpu", test):
        findings.append(
            Finding(
                f"{w} %test",
                repr(test),
                "`octo-dist check-env --no-gpu` (build hosts have no GPU)",
                "octo-dist check-env --no-gpu",
            )
        )
    return findings


def _definition_labels(w: str, d: Definition, profile: mf.Profile) -> list[Finding]:
    """%labels holds the OCI labels and the profile's."""
    findings = []
    labels = dict(
        ln.strip().split(None, 1)
        for ln in d.sections.get("labels", [])
        if ln.strip() and not ln.strip().startswith("#") and len(ln.split()) > 1
    )
    for label in REQUIRED_LABELS:
        if label not in labels:
            findings.append(
                Finding(
                    f"{w} %labels", f"no {label}", "the OCI labels and the profile", f"add {label}"
                )
            )
    if labels.get(PROFILE_LABEL, profile.name) != profile.name:
        findings.append(
            Finding(
                f"{w} %labels",
                f"{PROFILE_LABEL} {labels[PROFILE_LABEL]}",
                profile.name,
                f"`{PROFILE_LABEL} {profile.name}` under %labels",
            )
        )
    return findings


def check_os_packages(text: str) -> list[Finding]:
    """``containers/os-packages.sh`` installs every InfiniBand package for ``--infiniband``.

    The script holds them as one bash array: ``infiniband=(libibverbs1 ibverbs-providers librdmacm1)``.
    """
    m = re.search(r"^infiniband=\(([^)]*)\)", text, re.M)
    have = m.group(1).split() if m else []
    missing = [p for p in INFINIBAND_PACKAGES if p not in have]
    if not missing:
        return []
    return [
        Finding(
            OS_PACKAGES_SCRIPT,
            f"infiniband=({' '.join(have)})" if m else "no infiniband=(...) array",
            f"every one of {', '.join(INFINIBAND_PACKAGES)}",
            f"infiniband=({' '.join(INFINIBAND_PACKAGES)}) in {OS_PACKAGES_SCRIPT}",
        )
    ]


def check_checkout(
    source: Path = mf.REPO_ROOT, manifest: Optional[mf.Manifest] = None
) -> list[Finding]:
    """The Dockerfile, every GPU profile's Singularity definition and the OS package script of a checkout
    against its env/stack.toml."""
    manifest = manifest or mf.load_manifest(source / "env" / "stack.toml")
    gpu = [p.name for p in manifest.profiles.values() if p.image_base and p.gpu]
    findings = check_os_packages((source / OS_PACKAGES_SCRIPT).read_text())
    findings += check_dockerfile((source / DOCKERFILE).read_text(), manifest)
    for name in gpu:
        path = source / definition_file(name)
        if not path.is_file():
            findings.append(
                Finding(
                    definition_file(name),
                    "no such file",
                    f"a Singularity definition for the {name} profile's image",
                    f"copy {SINGULARITY_DEF} to {definition_file(name)} and change its profile and base image",
                )
            )
            continue
        findings += check_definition(path.read_text(), manifest, name)
    return findings


def definition_files(manifest: mf.Manifest) -> list[str]:
    """Every GPU profile's definition file name, in the manifest's order."""
    return [definition_file(p.name) for p in manifest.profiles.values() if p.image_base and p.gpu]


# ---------------------------------------------------------------------------------------------------
# make refresh-digests
# ---------------------------------------------------------------------------------------------------

Resolver = Callable[[str], str]


class RefreshError(Problem, RuntimeError):
    """A digest could not be resolved (no tool, or no registry reachable)."""


def manifest_digest(raw: bytes) -> str:
    """The digest a registry serves a manifest (or index) under: sha256 of its exact bytes."""
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def registry_resolver(which: Callable[[str], Optional[str]] = shutil.which) -> Resolver:
    """Resolve ``repo:tag`` to the digest of what the tag points at now, with crane or skopeo."""
    crane, skopeo = which("crane"), which("skopeo")
    if not (crane or skopeo):
        raise RefreshError(
            "refresh-digests found neither crane nor skopeo on PATH; expected one of them to ask the registry "
            "which digest each tag in env/stack.toml [images] points at now.\n"
            "  fix: apt-get install skopeo (or install crane), on a machine that reaches the registry, "
            "then `make refresh-digests`"
        )

    def resolve(ref: str) -> str:
        # skopeo: the index (multi-arch manifest list) itself, hashed as served -- the digest `FROM x@...` pulls.
        cmd = [crane, "digest", ref] if crane else [skopeo, "inspect", "--raw", f"docker://{ref}"]
        try:
            res = subprocess.run(cmd, capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise RefreshError(
                f"{' '.join(cmd)} timed out after 120 s; is a registry reachable from here?"
            ) from None
        if res.returncode != 0:
            tail = res.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise RefreshError(
                f"could not resolve {ref}: `{' '.join(cmd)}` exited {res.returncode}: {tail[0]}\n"
                f"  expected: a registry reachable from this machine (no registry is reachable on CI here)\n"
                f"  fix: run `make refresh-digests` where docker.io answers, or set HTTPS_PROXY"
            )
        return res.stdout.decode().strip() if crane else manifest_digest(res.stdout)

    return resolve


def refreshed(manifest: mf.Manifest, resolve: Resolver) -> dict[str, str]:
    """Old digest -> new digest for every base image whose tag now points elsewhere."""
    changes = {}
    for image in manifest.images.values():
        new = resolve(image.tagged)
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", new):
            raise RefreshError(
                f"resolving {image.tagged} gave {new!r}; expected 'sha256:' and 64 hex"
            )
        if new != image.digest:
            changes[image.digest] = new
    return changes


def refresh_digests(source: Path, resolve: Resolver) -> dict[str, str]:
    """Re-resolve every base image, rewrite env/stack.toml, render the definitions from it; return the changes."""
    stack = source / "env" / "stack.toml"
    changes = refreshed(mf.load_manifest(stack), resolve)
    text = stack.read_text()
    # Digests are unique strings, so a plain replace is exact (and keeps the file's comments).
    for old, new in changes.items():
        text = text.replace(old, new)
    stack.write_text(text)
    render_checkout(source)
    return changes


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m octo_dist.stack.imagedefs",
        description=" ".join(__doc__.split("\n\n")[0].split()),
    )
    parser.add_argument(
        "command",
        choices=("check", "render", "refresh-digests"),
        help="check: every definition against env/stack.toml; render: write env/'s pins into them "
        "(make image-defs); refresh-digests: re-resolve the base image digests (needs crane or "
        "skopeo), render, then check",
    )
    parser.add_argument(
        "--source", default=str(mf.REPO_ROOT), help="the checkout (default: this one)"
    )
    args = parser.parse_args(argv)
    source = Path(args.source)
    try:
        if args.command == "refresh-digests":
            changes = refresh_digests(source, registry_resolver())
            for old, new in changes.items():
                print(f"{old} -> {new}")
            print(
                f"refresh-digests: {len(changes)} base image digest(s) changed"
                + ("; rebuild the images" if changes else "")
            )
        if args.command == "render":
            changed = render_checkout(source)
            print(f"render: {', '.join(changed) or 'nothing'} rewritten from env/stack.toml")
        findings = check_checkout(source)
    except mf.ManifestError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RefreshError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    for f in findings:
        print(f"error: {f}", file=sys.stderr)
    if findings:
        print(
            f"{len(findings)} disagreement(s) between the image definitions and env/stack.toml",
            file=sys.stderr,
        )
        return EXIT_FAILED
    names = ", ".join(
        [DOCKERFILE, *definition_files(mf.load_manifest(source / "env" / "stack.toml"))]
    )
    print(f"{names} agree with env/stack.toml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
