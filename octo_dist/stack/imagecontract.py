"""What every octo-dist image promises, and the pins it takes from env/stack.toml.

The Dockerfile's targets and each GPU profile's Singularity definition share one contract: their names
(:func:`definition_file`: ``singularity.def`` for ``cuda11``, ``singularity-<profile>.def`` for the others), the
install script and OS package script they run, the InfiniBand userland of the GPU images, the labels, the manifest
path inside the image, names never baked in, and the pinned lines ``make image-defs`` writes from env/
(:func:`render`; :func:`stale_pins` reports each one that drifted). :mod:`.dockerfile` and :mod:`.singularitydef`
check a definition against it; :mod:`.imagedefs` runs every check on a checkout.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Iterable, Optional

from octo_dist import __version__
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


def unless_equal(where: str, what: str, found: Optional[str], want: str, fix: str) -> list[Finding]:
    """``[]`` when a definition's ``what`` (``"ENV OCTO_DIST_PROFILE"``) holds ``want``; else the one finding that
    shows both: ``found ENV OCTO_DIST_PROFILE='cuda11'; expected 'cuda12'``."""
    return [] if found == want else [Finding(where, f"{what}={found!r}", repr(want), fix)]


def logical_lines(text: str) -> list[str]:
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


def install_runs(commands: Iterable[str], profile: str) -> list[str]:
    """The commands that run ``containers/install.sh <profile> ...``."""
    pat = re.compile(r"(^|[\s/])" + re.escape(INSTALL_SCRIPT) + r"\s+" + re.escape(profile) + r"\s")
    return [c for c in commands if pat.search(c + " ")]


def install_findings(
    where: str,
    runs: tuple[list[str], list[str]],
    profile: mf.Profile,
    fixes: tuple[str, str],
    *,
    require_git: bool = False,
) -> list[Finding]:
    """The two installs every image makes, among the commands a definition runs: the install script for
    ``profile`` in ``runs[0]`` (with ``--require-git`` where the definition spells it out) and, in a GPU image, the
    InfiniBand userland in ``runs[1]`` (a Dockerfile: the RUNs of every stage reaching the target, then of the
    target's own stages, since a builder's OS packages never reach the image; %post: its lines, twice).
    ``fixes``: the two lines to add, as the definition writes them (``"RUN containers/install.sh cuda11
    /opt/octo-dist/venv --require-git"``, ``"RUN bash /tmp/os-packages.sh runtime --infiniband"``)."""
    findings = []
    installs = install_runs(runs[0], profile.name)
    if not installs:
        found = f"no `{INSTALL_SCRIPT} {profile.name} ...`"
        findings.append(
            Finding(where, found, f"the one install script, for {profile.name}", fixes[0])
        )
    elif require_git and not all("--require-git" in c for c in installs):
        said = "--require-git (an image without octo is not an image)"
        findings.append(Finding(where, installs[0], said, "add --require-git"))
    if profile.gpu and not any(INFINIBAND_RUN.search(c) for c in runs[1]):
        findings.append(
            Finding(
                where,
                "no `os-packages.sh ... --infiniband`",
                f"the InfiniBand userland ({', '.join(INFINIBAND_PACKAGES)}) in a GPU image, "
                "else NCCL runs over TCP sockets between nodes",
                fixes[1],
            )
        )
    return findings


def definition_file(profile: str) -> str:
    """The Singularity definition of a GPU profile's image: ``"cuda11"`` -> ``"singularity.def"``,
    ``"cuda12"`` -> ``"singularity-cuda12.def"``."""
    return SINGULARITY_DEF if profile == FIRST_GPU_PROFILE else f"singularity-{profile}.def"


def definition_files(manifest: mf.Manifest) -> list[str]:
    """Every GPU profile's definition file name, in the manifest's order."""
    return [definition_file(p.name) for p in manifest.profiles.values() if p.image_base and p.gpu]


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
