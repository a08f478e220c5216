"""The Dockerfile, read as text and checked against env/stack.toml, one target (profile) at a time.

Conventions the checks rely on: global ``ARG <KEY>_BASE_REPO / _TAG / _DIGEST`` per ``[images.<key>]``
(``CUDA11_BASE_DIGEST``), a final stage named after each profile (``--target cuda11``), ``FROM <repo>@<digest>`` (no
engine but Docker accepts a tag and a digest in one reference, so the tag travels in a label); the GPU targets run
``containers/os-packages.sh ... --infiniband``. Pure over the file's text and a manifest: tests fabricate a drifted
copy and see it reported.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Iterable, Mapping, Optional

from octo_dist import __version__
from octo_dist.stack import imagecontract as ic
from octo_dist.stack import manifest as mf


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


def parse_dockerfile(text: str) -> Dockerfile:
    """Split a Dockerfile into global ARG defaults and stages (enough for the checks; not a full parser)."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    cur: Optional[tuple[str, str, list]] = None
    for line in ic.logical_lines(text):
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


def check_dockerfile(
    text: str, manifest: mf.Manifest, version: str = __version__
) -> list[ic.Finding]:
    """Every disagreement between a Dockerfile's targets and the manifest's image profiles.

    Args:
        text: the Dockerfile.
        manifest: env/stack.toml, parsed.
        version: octo-dist's version, which the ``VERSION`` default (the version label) must equal.
    """
    df = parse_dockerfile(text)
    findings = ic.stale_pins(ic.DOCKERFILE, text, manifest, version)
    pinned_args = parse_dockerfile(ic.render(text, manifest, version)).args
    for profile in (p for p in manifest.profiles.values() if p.image_base):
        findings += _check_target(df, profile, manifest.images[profile.image_base], pinned_args)
    return findings


def _check_target(
    df: Dockerfile, profile: mf.Profile, image: mf.BaseImage, pinned_args: Mapping[str, str]
) -> list[ic.Finding]:
    """The findings of one profile's ``--target``: its stage, base image, environment, labels, install, user,
    command and build-time secrets, in that order."""
    where = f"{ic.DOCKERFILE} target {profile.name}"
    if df.stage(profile.name) is None:
        return [
            ic.Finding(
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
            ic.Finding(
                where,
                f"base image {base!r} = {resolved!r}",
                f"{image.pinned!r} (env/stack.toml [images.{image.name}])",
                ic.RENDER_FIX,
            )
        )
    findings += _target_env(where, chain, profile)
    findings += _target_labels(where, df, chain, profile)
    findings += _target_installs(where, df, chain, profile)
    findings += _target_user_and_command(where, chain)
    findings += _target_secrets(where, _reachable(df, profile.name))
    return findings


def _target_env(where: str, chain: list[Stage], profile: mf.Profile) -> list[ic.Finding]:
    """The profile and the manifest's path in the target's environment."""
    env = _env_of(chain, "ENV")
    profile_fix = f"`ENV {mf.PROFILE_ENV}={profile.name}` in the {profile.name} stage"
    manifest_fix = (
        f"COPY env/ to {ic.IMAGE_PREFIX}/env and set `ENV {mf.MANIFEST_ENV}={ic.IMAGE_MANIFEST}`"
    )
    return [
        *ic.unless_equal(
            where, f"ENV {mf.PROFILE_ENV}", env.get(mf.PROFILE_ENV), profile.name, profile_fix
        ),
        *ic.unless_equal(
            where,
            f"ENV {mf.MANIFEST_ENV}",
            env.get(mf.MANIFEST_ENV),
            ic.IMAGE_MANIFEST,
            manifest_fix,
        ),
    ]


def _target_labels(
    where: str, df: Dockerfile, chain: list[Stage], profile: mf.Profile
) -> list[ic.Finding]:
    """The OCI labels and the profile label, ARGs substituted."""
    labels = {k: substitute(v, df.args) for k, v in _env_of(chain, "LABEL").items()}
    findings = []
    for label in ic.REQUIRED_LABELS:
        if label not in labels:
            findings.append(
                ic.Finding(
                    where,
                    f"no LABEL {label}",
                    "the OCI labels source, revision, version, "
                    "base.name, base.digest and the profile",
                    f"add `LABEL {label}=...`",
                )
            )
    fix = f'LABEL {ic.PROFILE_LABEL}="{profile.name}"'
    found = labels.get(ic.PROFILE_LABEL, profile.name)  # a missing label is reported above
    return findings + ic.unless_equal(where, f"LABEL {ic.PROFILE_LABEL}", found, profile.name, fix)


def _target_installs(
    where: str, df: Dockerfile, chain: list[Stage], profile: mf.Profile
) -> list[ic.Finding]:
    """The install script's RUN for the profile and, in a GPU image, the InfiniBand userland's."""
    own = [i.args for s in chain for i in s.instructions if i.keyword == "RUN"]
    fixes = (
        f"RUN {ic.INSTALL_SCRIPT} {profile.name} {ic.IMAGE_PREFIX}/venv --require-git",
        "RUN bash /tmp/os-packages.sh runtime --infiniband",
    )
    return ic.install_findings(where, (target_runs(df, profile.name), own), profile, fixes)


def _target_user_and_command(where: str, chain: list[Stage]) -> list[ic.Finding]:
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
            ic.Finding(
                where,
                f"USER {users[-1] if users else '(none: root)'}",
                "a non-root user",
                "`USER octo` after the install, in the final stage",
            )
        )
    cmds = [i.args for s in chain for i in s.instructions if i.keyword == "CMD"]
    if not cmds or not re.search(r"octo-dist\W+check-env", cmds[0]):
        findings.append(
            ic.Finding(
                where,
                f"CMD {cmds[0] if cmds else '(none)'}",
                '["octo-dist", "check-env"]',
                'CMD ["octo-dist", "check-env"]',
            )
        )
    return findings


def _target_secrets(where: str, reach: list[Stage]) -> list[ic.Finding]:
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
                if ic.SECRET_NAME.search(name):
                    findings.append(
                        ic.Finding(
                            f"{where} (stage {stage.name or stage.base})",
                            f"{ins.keyword} {name}",
                            "no credential or CA set at build time",
                            "pass it at run time (docker run -e, SINGULARITYENV_...) or as a "
                            "build secret (RUN --mount=type=secret,id=ca)",
                        )
                    )
    return findings
