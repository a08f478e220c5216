"""A Singularity/Apptainer definition (``singularity.def``, ``singularity-cuda12.def``), read as text and checked
against env/stack.toml: its header, ``%post``, ``%environment``, ``%runscript``/``%test`` and ``%labels``.

Each GPU profile has one (:func:`~octo_dist.stack.imagecontract.definition_file`), with ``From: <repo>@<digest>``,
the Dockerfile's labels and ``containers/os-packages.sh ... --infiniband`` in ``%post``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Optional, Sequence

from octo_dist import __version__
from octo_dist.stack import imagecontract as ic
from octo_dist.stack import manifest as mf


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
    return "\n".join(ic.logical_lines("\n".join(lines)))


def check_definition(
    text: str,
    manifest: mf.Manifest,
    profile_name: str = "cuda11",
    version: str = __version__,
) -> list[ic.Finding]:
    """Every disagreement between a Singularity definition and the manifest's ``profile_name`` (a GPU image)."""
    d = parse_definition(text)
    profile = manifest.profile(profile_name)
    w = ic.definition_file(profile_name)
    findings = ic.stale_pins(w, text, manifest, version, profile_name)
    findings += _definition_layout(w, d)
    findings += _definition_post(w, d, profile)
    findings += _definition_environment(w, d, profile)
    findings += _definition_run_and_test(w, d)
    findings += _definition_labels(w, d, profile)
    return findings


def _definition_layout(w: str, d: Definition) -> list[ic.Finding]:
    """The docker bootstrap, every section, and the source trees copied in under %files."""
    findings = []
    if d.header.get("bootstrap", "").lower() != "docker":
        findings.append(
            ic.Finding(
                f"{w} header",
                f"Bootstrap: {d.header.get('bootstrap')!r}",
                "'docker'",
                "Bootstrap: docker",
            )
        )
    for section in ic.SINGULARITY_SECTIONS:
        if not [ln for ln in d.sections.get(section, []) if ln.strip()]:
            findings.append(
                ic.Finding(
                    f"{w} %{section}",
                    "no such section, or an empty one",
                    f"every one of %{', %'.join(ic.SINGULARITY_SECTIONS)}",
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
                ic.Finding(
                    f"{w} %files",
                    f"no {needed}",
                    "env/, containers/, octo_dist/, scripts/ and "
                    "pyproject.toml copied in (the install script installs from them)",
                    f"`{needed} {ic.IMAGE_PREFIX}/{needed}` under %files",
                )
            )
    return findings


def _definition_post(w: str, d: Definition, profile: mf.Profile) -> list[ic.Finding]:
    """%post runs the install script for the profile (``--require-git``) and, for a GPU, the InfiniBand packages."""
    post = shell_body(d.sections.get("post", [])).splitlines()
    fixes = (
        f"{ic.IMAGE_PREFIX}/{ic.INSTALL_SCRIPT} {profile.name} {ic.IMAGE_PREFIX}/venv --require-git",
        f"bash {ic.IMAGE_PREFIX}/{ic.OS_PACKAGES_SCRIPT} build --infiniband",
    )
    return ic.install_findings(f"{w} %post", (post, post), profile, fixes, require_git=True)


def _definition_environment(w: str, d: Definition, profile: mf.Profile) -> list[ic.Finding]:
    """%environment sets the profile, ``PYTHONNOUSERSITE`` and the manifest; no ``LD_LIBRARY_PATH``, no secret."""
    findings = []
    env_body = shell_body(d.sections.get("environment", []))
    env = dict(re.findall(r"(?:export\s+)?(\w+)=(\S*)", env_body))
    for name, want in (
        (mf.PROFILE_ENV, profile.name),
        ("PYTHONNOUSERSITE", "1"),
        (mf.MANIFEST_ENV, ic.IMAGE_MANIFEST),
    ):
        found = env.get(name, "").strip("\"'")  # export X="1" holds 1
        fix = f"`export {name}={want}` in %environment"
        findings += ic.unless_equal(f"{w} %environment", name, found, want, fix)
    # --nv binds the host driver's libraries and points LD_LIBRARY_PATH at them; overwriting it here hides them.
    if "LD_LIBRARY_PATH" in env:
        findings.append(
            ic.Finding(
                f"{w} %environment",
                f"LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}",
                "no LD_LIBRARY_PATH (singularity --nv sets it to the bound driver libraries)",
                "remove it; the CUDA libraries come from the nvidia-*-cu11/-cu12 wheels, found by jaxlib",
            )
        )
    for name in env:
        if ic.SECRET_NAME.search(name):
            findings.append(
                ic.Finding(
                    f"{w} %environment",
                    name,
                    "no credentials in the image",
                    f"pass it at run time: SINGULARITYENV_{name}=... or --env-file",
                )
            )
    return findings


def _definition_run_and_test(w: str, d: Definition) -> list[ic.Finding]:
    """%runscript execs ``octo-dist``; %test runs ``check-env --no-gpu``."""
    findings = []
    runscript = shell_body(d.sections.get("runscript", []))
    if not re.search(r"\bexec\b.*\bocto-dist\b", runscript):
        findings.append(
            ic.Finding(
                f"{w} %runscript", repr(runscript), '`exec octo-dist "$@"`', 'exec octo-dist "$@"'
            )
        )
    test = shell_body(d.sections.get("test", []))
    if not re.search(r"octo-dist\s+check-env\b.*--no-gpu", test):
        findings.append(
            ic.Finding(
                f"{w} %test",
                repr(test),
                "`octo-dist check-env --no-gpu` (build hosts have no GPU)",
                "octo-dist check-env --no-gpu",
            )
        )
    return findings


def _definition_labels(w: str, d: Definition, profile: mf.Profile) -> list[ic.Finding]:
    """%labels holds the OCI labels and the profile's."""
    findings = []
    labels = dict(
        ln.strip().split(None, 1)
        for ln in d.sections.get("labels", [])
        if ln.strip() and not ln.strip().startswith("#") and len(ln.split()) > 1
    )
    for label in ic.REQUIRED_LABELS:
        if label not in labels:
            findings.append(
                ic.Finding(
                    f"{w} %labels", f"no {label}", "the OCI labels and the profile", f"add {label}"
                )
            )
    if labels.get(ic.PROFILE_LABEL, profile.name) != profile.name:
        findings.append(
            ic.Finding(
                f"{w} %labels",
                f"{ic.PROFILE_LABEL} {labels[ic.PROFILE_LABEL]}",
                profile.name,
                f"`{ic.PROFILE_LABEL} {profile.name}` under %labels",
            )
        )
    return findings
