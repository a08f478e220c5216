"""The checks, as pure functions over what was found (mappings and strings you can write down)."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from octo_dist.stack import manifest as mf
from octo_dist.stack.builds import (
    cuda_plugin,
    cudnn_tag,
    cudnn_wheel as build_cudnn_wheel,
    jax_build,
)
from octo_dist.envcheck import gpus as gpu_list
from octo_dist.envcheck.installed import Installed, versions as installed_versions
from octo_dist.envcheck.result import FAIL, OK, SKIP, WARN, Check

ENV_FIX = "make env PROFILE={profile}"


def _pin_remedy(profile: mf.Profile, name: str, version: str) -> str:
    for wheel in profile.direct:
        if wheel.name == name:
            return f"pip install --no-deps '{name} @ {wheel.url}'"
    return f"pip install --no-deps {name}=={version}"


def check_python(profile: mf.Profile, python: str) -> Check:
    """``python`` is ``"3.11"``; the profile's images use ``profile.python``, locks exist for ``lock_pythons``."""
    allowed = profile.lock_pythons
    status = OK if python in allowed else FAIL
    return Check(
        "python.version",
        status,
        python,
        " or ".join(allowed),
        "" if status == OK else f"PYTHON=python{profile.python} make env PROFILE={profile.name}",
    )


def check_pins(profile: mf.Profile, python: str, versions: Mapping[str, str]) -> list[Check]:
    checks = []
    for name, want in sorted(profile.exact_pins(python).items()):
        have = versions.get(name)
        status = OK if have == want else FAIL
        checks.append(
            Check(
                f"pin.{name}",
                status,
                have or "not installed",
                want,
                "" if status == OK else _pin_remedy(profile, name, want),
            )
        )
    return checks


def check_scipy_tril(versions: Mapping[str, str], profile: mf.Profile) -> Optional[Check]:
    """scipy 1.13 removed scipy.linalg.tril, which jax.scipy.linalg (0.4.20 to 0.4.23) wraps at import."""
    have = versions.get("scipy")
    if have is None:
        return None
    ok = Version(have) < Version("1.13")
    want = profile.exact_pins().get("scipy", "<1.13")
    return Check(
        "rule.scipy-tril",
        OK if ok else FAIL,
        have,
        "<1.13 (1.13 removed scipy.linalg.tril: \"module 'scipy.linalg' has no attribute 'tril'\")",
        "" if ok else f"pip install --no-deps scipy=={want}",
    )


def check_jax_jaxlib(versions: Mapping[str, str], profile: mf.Profile) -> Optional[Check]:
    """jax only rejects a jaxlib *newer* than itself; the stack wants them equal, both ways.

    The CUDA plugin pair (``jax-cuda12-plugin``, ``jax-cuda12-pjrt``) too: built with one jaxlib, it loads into
    no other (jax's ``cuda12`` extra pins them to its own version).
    """
    jax, jaxlib = versions.get("jax"), versions.get("jaxlib")
    if jax is None or jaxlib is None:
        return None
    parts = {"jaxlib": jaxlib}
    plugin = cuda_plugin(versions)
    if plugin:
        pjrt = f"jax-cuda{plugin[1]}-pjrt"
        parts[plugin[0]] = versions[plugin[0]]
        parts[pjrt] = versions.get(pjrt, "not installed")
    wrong = [n for n, v in parts.items() if v.split("+", 1)[0] != jax]
    pins = profile.exact_pins()
    return Check(
        "rule.jax-jaxlib",
        FAIL if wrong else OK,
        ", ".join(f"{n} {v}" for n, v in {"jax": jax, **parts}.items()),
        f"{' and '.join(parts)} == jax ({jax})",
        " && ".join(_pin_remedy(profile, n, pins.get(n, jax)) for n in wrong),
    )


def cudnn_compatible(built: tuple[int, int], version: str) -> bool:
    """Same major, minor >= the one jaxlib was built with (8.6 build: 8.6 and 8.9 load, 9.1 does not)."""
    parts = [int(p) for p in version.split(".")[:2]]
    return parts[0] == built[0] and parts[1] >= built[1]


def cudnn_wheel(versions: Mapping[str, str], profile: mf.Profile) -> Optional[str]:
    """The wheel that carries cuDNN for this JAX build: ``nvidia-cudnn-cu12`` for ``0.4.23+cuda12.cudnn89``.

    From the installed build's CUDA major (a CUDA jaxlib's tag, or the CUDA plugin), else from the profile's pinned
    build, else the ``nvidia-cudnn-cu*`` the profile pins; None for a profile without one (cpu).
    """
    pins = profile.exact_pins()
    for build in (jax_build(versions), jax_build(pins)):
        wheel = build_cudnn_wheel(build)
        if wheel:
            return wheel
    return next((n for n in sorted(pins) if n.startswith("nvidia-cudnn-cu")), None)


def built_by(versions: Mapping[str, str]) -> str:
    """What carries the CUDA code: ``"jaxlib 0.4.20+cuda11.cudnn86"`` or ``"jax-cuda12-plugin 0.4.23"``."""
    plugin = cuda_plugin(versions)
    if plugin and not versions.get("jaxlib", "").partition("+")[2]:
        return f"{plugin[0]} {versions[plugin[0]]}"
    return f"jaxlib {versions.get('jaxlib')}"


def check_cudnn_wheel(versions: Mapping[str, str], profile: mf.Profile) -> Optional[Check]:
    tag = cudnn_tag(jax_build(versions, profile.cudnn_build))
    wheel = cudnn_wheel(versions, profile)
    if tag is None or wheel is None:
        return None
    have = versions.get(wheel)
    want = profile.exact_pins().get(wheel, f"{tag[0]}.{tag[1]}")
    expected = f"cuDNN {tag[0]}.x with minor >= {tag[1]} ({built_by(versions)} was built against {tag[0]}.{tag[1]})"
    ok = have is not None and cudnn_compatible(tag, have)
    return Check(
        "cudnn.wheel",
        OK if ok else FAIL,
        have or f"{wheel} not installed",
        expected,
        "" if ok else f"pip install --no-deps {wheel}=={want}",
    )


def check_cudnn_load(
    versions: Mapping[str, str], profile: mf.Profile, probe: tuple
) -> Optional[Check]:
    """``probe`` is cudnn.probe()'s (library, version, error). Unloadable: JAX says "Found cuDNN version 0" and
    runs on the CPU."""
    if not profile.gpu:
        return None
    lib, version, error = probe
    pins = profile.exact_pins()
    wheel = cudnn_wheel(versions, profile)
    want = pins.get(wheel) if wheel else None
    tag = cudnn_tag(jax_build(versions, profile.cudnn_build)) or cudnn_tag(
        jax_build(pins, profile.cudnn_build)
    )
    if want is None or tag is None:
        return None  # this GPU profile pins no cuDNN wheel: nothing to compare with
    remedy = f"pip install --force-reinstall --no-deps {wheel}=={want}"
    if version is None:
        return Check(
            "cudnn.load",
            FAIL,
            f"cannot load libcudnn ({error})",
            f"a loadable libcudnn {tag[0]}.{tag[1]}+ (else JAX reports 'Found cuDNN version 0' and runs on the CPU)",
            remedy,
        )
    ok = cudnn_compatible(tag, version)
    return Check(
        "cudnn.load",
        OK if ok else FAIL,
        f"{version} from {lib}",
        f"{tag[0]}.x with minor >= {tag[1]}",
        "" if ok else remedy,
    )


def _marker_env(python: str) -> dict:
    env = default_environment()
    env["python_version"] = python
    return env


def check_consistency(
    installed: Mapping[str, Installed], profile: mf.Profile, python: str
) -> Check:
    """Every installed distribution's requirements (no extras) hold, the manifest's intended overrides excepted."""
    env = _marker_env(python)
    intended = {(o.required_by, o.package): o for o in profile.overrides}
    broken, excused = [], []
    for dist in installed.values():
        for raw in dist.requires:
            # Requirements behind an extra ("nvidia-cudnn-cu11 >=8.8 ; extra == 'cuda11_pip'") are
            # not evaluated (pip check doesn't either); skipping them before parsing halves the time.
            if "extra" in raw.partition(";")[2]:
                continue
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate(dict(env, extra="")):
                continue
            name = mf.canonical_name(req.name)
            dep = installed.get(name)
            if dep is None:
                problem = f"{dist.name} {dist.version} requires {req}, which is not installed"
            else:
                try:
                    if req.specifier.contains(Version(dep.version), prereleases=True):
                        continue
                except InvalidVersion:
                    continue
                problem = f"{dist.name} {dist.version} requires {req}, found {dep.version}"
            if (dist.name, name) in intended:
                excused.append(f"{problem} (intended: {intended[(dist.name, name)].reason})")
            else:
                broken.append(problem)
    found = (
        "; ".join(broken)
        if broken
        else ("consistent" + (f"; intended: {'; '.join(excused)}" if excused else ""))
    )
    return Check(
        "deps.consistent",
        FAIL if broken else OK,
        found,
        "every installed requirement satisfied (intended overrides in env/stack.toml excepted)",
        ENV_FIX.format(profile=profile.name) if broken else "",
    )


def check_git(
    installed: Mapping[str, Installed],
    deps: Sequence[mf.GitDep],
    profile: mf.Profile,
    no_gpu: bool = False,
) -> list[Check]:
    """A missing git dependency fails a GPU profile where it will fine-tune; a warning off the GPU (``no_gpu``: an
    image build or a login node, which may not reach GitHub) and for the cpu profile. A wrong commit always fails."""
    checks = []
    for dep in deps:
        dist = installed.get(mf.canonical_name(dep.distribution))
        remedy = (
            f"pip install --no-deps '{dep.pip_spec}'   (or: make git-deps PROFILE={profile.name})"
        )
        if dist is None:
            # Not fatal off the GPU: CI here has no GitHub, and the engine and smoke job need no octo.
            checks.append(
                Check(
                    f"git.{dep.name}",
                    FAIL if profile.gpu and not no_gpu else WARN,
                    "not installed",
                    f"{dep.distribution} from {dep.url} at {dep.commit}",
                    remedy,
                )
            )
            continue
        commit = ((dist.direct_url or {}).get("vcs_info") or {}).get("commit_id")
        ok = commit == dep.commit
        checks.append(
            Check(
                f"git.{dep.name}",
                OK if ok else FAIL,
                f"{dist.version} at {commit or 'no recorded commit (not a pinned git install)'}",
                f"commit {dep.commit}",
                "" if ok else remedy,
            )
        )
    return checks


def check_gpus(
    environ: Mapping[str, str], smi_output: Optional[str], profile: mf.Profile
) -> list[Check]:
    """``smi_output`` is ``nvidia-smi -L``'s stdout ("GPU 0: NVIDIA H200 (UUID: ...)"), None if it did not run."""
    if not profile.gpu:
        return []
    gpus = gpu_list.listed(smi_output) or []
    checks = [
        Check(
            "gpu.visible",
            OK if gpus else FAIL,
            f"{len(gpus)} GPU(s)" if smi_output is not None else "nvidia-smi not found",
            ">= 1 GPU from nvidia-smi -L",
            ""
            if gpus
            else "run on a GPU node (qsub/qrsh); in a container use `singularity exec --nv`",
        )
    ]
    cvd = environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and gpus:
        visible = [d.strip() for d in cvd.split(",") if d.strip()]
        hidden = len(gpus) - len(visible)
        # "", "-1" or "NoDevFiles" hide every GPU: nvidia-smi still lists them, JAX sees none -> CPU.
        none_left = not visible or visible[0] in ("-1", "NoDevFiles")
        # In a job on a shared node (ABCI's rt_HG) the hidden GPUs are other jobs': never advise unsetting it.
        shared = gpu_list.shared_node(environ)
        status = FAIL if none_left else (OK if hidden <= 0 else WARN)
        found = f"CUDA_VISIBLE_DEVICES={cvd!r} with {len(gpus)} GPUs"
        fix = "" if status == OK else "unset CUDA_VISIBLE_DEVICES"
        if shared and status != OK:
            found += f" listed by nvidia-smi, in {shared}"
            fix = (
                "leave CUDA_VISIBLE_DEVICES as the scheduler set it (unsetting it would use GPUs of other jobs); "
                "for more GPUs ask the scheduler for them (ABCI: --resource-type rt_HF, a whole node)"
            )
            if not none_left and "a share of a node" in shared:
                status, fix = OK, ""  # the job's own share of a shared node: what it asked for
        checks.append(
            Check(
                "gpu.cuda-visible-devices",
                status,
                found,
                "no GPU hidden (octo-dist binds one GPU per rank itself), or the job's share of a shared node",
                fix,
            )
        )
    return checks


def skipped_gpu_checks() -> Check:
    """What ``--no-gpu`` leaves out, said in the report (image builds and login nodes have no GPU)."""
    return Check(
        "gpu.*",
        SKIP,
        "skipped (--no-gpu): gpu.visible and gpu.cuda-visible-devices need a GPU node",
        "",
        "",
    )


def check_proxy(environ: Mapping[str, str]) -> Optional[Check]:
    """An HTTP(S) proxy without NO_PROXY for the coordinator can make jax.distributed.initialize hang (gRPC)."""
    proxies = [
        k
        for k in (
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "GRPC_PROXY",
            "grpc_proxy",
        )
        if environ.get(k)
    ]
    if not proxies:
        return None
    coordinator = environ.get("COORDINATOR_ADDRESS") or environ.get("JAX_COORDINATOR_ADDRESS") or ""
    host = coordinator.rsplit(":", 1)[0] if coordinator else ""
    no_proxy = [
        h.strip()
        for h in (environ.get("NO_PROXY") or environ.get("no_proxy") or "").split(",")
        if h.strip()
    ]
    needed = [
        h
        for h in ([host] if host else ["localhost"])
        if not any(h == n or (n.startswith(".") and h.endswith(n)) or n == "*" for n in no_proxy)
    ]
    status = OK if not needed else WARN
    return Check(
        "net.proxy",
        status,
        f"{', '.join(proxies)} set; NO_PROXY={','.join(no_proxy) or '(unset)'}",
        f"NO_PROXY covering the coordinator host ({host or 'the first node / localhost'})",
        "" if status == OK else f"export NO_PROXY={','.join(no_proxy + needed + ['127.0.0.1'])}",
    )


def run_fast(
    profile: mf.Profile,
    manifest: mf.Manifest,
    python: str,
    installed: Mapping[str, Installed],
    environ: Mapping[str, str],
    cudnn_probe: tuple,
    smi_output: Optional[str],
    no_gpu: bool = False,
) -> list[Check]:
    versions = installed_versions(installed)
    checks: list[Optional[Check]] = [check_python(profile, python)]
    checks += check_pins(profile, python, versions)
    checks += [
        check_scipy_tril(versions, profile),
        check_jax_jaxlib(versions, profile),
        check_cudnn_wheel(versions, profile),
        check_cudnn_load(versions, profile, cudnn_probe),
        check_consistency(installed, profile, python),
    ]
    checks += check_git(installed, manifest.git, profile, no_gpu)
    checks += check_gpus(environ, smi_output, profile)
    checks.append(check_proxy(environ))
    return [c for c in checks if c is not None]
