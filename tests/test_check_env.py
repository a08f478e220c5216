"""`octo-dist check-env` against fabricated broken environments, run for real in a subprocess.

Each broken environment is a site dir put first on PYTHONPATH (so it shadows the venv, as it would
for imports) holding the dist-info of the failure, plus a real shared library built with gcc that
exports cudnnGetVersion, and a fake nvidia-smi on PATH. The manifest is the real one, with Python
3.11 allowed for cuda11 and cuda12 (this machine has no Python 3.10 venv to spare).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from octo_dist.stack import manifest as mf
from octo_dist.envcheck import cudnn, rules
from octo_dist.stack import builds
from helpers import HANG_S

REAL = mf.load_manifest()
CUDA = REAL.profile("cuda11")
CUDA12 = REAL.profile("cuda12")


def make_dist(site: Path, name: str, version: str, requires=(), commit=None):
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires]
    (d / "METADATA").write_text("\n".join(meta) + "\n")
    if commit:
        (d / "direct_url.json").write_text(
            json.dumps(
                {"url": "https://github.com/x/y", "vcs_info": {"vcs": "git", "commit_id": commit}}
            )
        )


def replace_dist(site: Path, name: str, version: str, requires=(), commit=None):
    """Swap the fabricated environment's copy of ``name`` for ``version``: one failure per test."""
    for old in site.glob(f"{name.replace('-', '_')}-*.dist-info"):
        shutil.rmtree(old)
    make_dist(site, name, version, requires, commit)


def build_cudnn(site: Path, version=8600, export=True):
    if not shutil.which("gcc"):
        pytest.skip("gcc not found")
    lib = site / "nvidia" / "cudnn" / "lib"
    lib.mkdir(parents=True)
    src = lib / "fake.c"
    body = (
        f"size_t cudnnGetVersion(void) {{ return {version}; }}"
        if export
        else "int cudnnSomethingElse(void) { return 0; }"
    )
    src.write_text("#include <stddef.h>\n" + body + "\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(lib / "libcudnn.so.8"), str(src)], check=True
    )


@pytest.fixture
def cuda_env(tmp_path):
    """A complete, correct cuda11 environment (fabricated); tests break one thing each."""
    return fabricate(tmp_path, CUDA)


@pytest.fixture
def cuda12_env(tmp_path):
    """The same for cuda12: PyPI's jaxlib, jax-cuda12-plugin/-pjrt and every nvidia-*-cu12 at its pin."""
    return fabricate(tmp_path, CUDA12)


def fabricate(tmp_path, profile):
    site = tmp_path / "site"
    site.mkdir()
    for name, version in profile.exact_pins("3.11").items():
        if name in ("octo", "dlimp"):
            continue
        make_dist(site, name, version)
    for dep in REAL.git:
        make_dist(site, dep.distribution, "0.1.0", commit=dep.commit)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\necho 'GPU 1: NVIDIA H200 (UUID: GPU-1)'\n"
    )
    smi.chmod(0o755)
    data = mf.loads(mf.DEFAULT_MANIFEST.read_text())
    for name in ("cuda11", "cuda12"):
        data["profiles"][name]["lock_pythons"] = ["3.10", "%d.%d" % sys.version_info[:2]]
    manifest = tmp_path / "stack.toml"
    manifest.write_text(_to_toml(data))
    return site, bin_dir, manifest


def _to_toml(data) -> str:
    # Minimal TOML writer for the manifest's shapes (no TOML writer is in the lock).
    out = []

    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return json.dumps(v)

    def table(prefix, t):
        scalars = {
            k: v
            for k, v in t.items()
            if not isinstance(v, dict)
            and not (isinstance(v, list) and v and isinstance(v[0], dict))
        }
        if prefix:
            out.append(f"[{prefix}]")
        out.extend(f"{json.dumps(k)} = {val(v)}" for k, v in scalars.items())
        for k, v in t.items():
            key = f"{prefix}.{json.dumps(k)}" if prefix else json.dumps(k)
            if isinstance(v, dict):
                table(key, v)
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                for item in v:
                    out.append(f"[[{key}]]")
                    out.extend(f"{json.dumps(a)} = {val(b)}" for a, b in item.items())

    table("", data)
    return "\n".join(out) + "\n"


def run_check(site, bin_dir, manifest, *extra, env_extra=None, profile="cuda11"):
    env = dict(os.environ, PYTHONPATH=str(site), PATH=f"{bin_dir}:{os.environ['PATH']}")
    for k in (
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "CUDA_VISIBLE_DEVICES",
        "OCTO_DIST_PROFILE",
    ):
        env.pop(k, None)
    env.update(env_extra or {})
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "octo_dist",
            "check-env",
            *(["--profile", profile] if profile else []),
            "--manifest",
            str(manifest),
            "--json",
            *extra,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_S,
    )
    report = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc.returncode, {c["id"]: c for c in (report or {"checks": []})["checks"]}, proc


def failing(checks):
    return {i for i, c in checks.items() if c["status"] == "fail"}


def test_correct_cuda11_environment_passes(cuda_env):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, 8600)
    rc, checks, proc = run_check(site, bin_dir, manifest)
    assert failing(checks) == set(), proc.stdout
    assert rc == 0
    assert checks["cudnn.load"]["found"].startswith("8.6.0 from ")
    assert checks["gpu.visible"]["found"] == "2 GPU(s)"


def test_cudnn9_wheel_beside_cudnn86_jaxlib_fails_with_the_86_pin(cuda_env):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, 8600)
    replace_dist(site, "nvidia-cudnn-cu11", "9.1.1.17")
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 1
    assert {"cudnn.wheel", "pin.nvidia-cudnn-cu11"} <= failing(checks)
    assert "nvidia-cudnn-cu11==8.6.0.163" in checks["cudnn.wheel"]["remedy"]
    assert "built against 8.6" in checks["cudnn.wheel"]["expected"]


def test_loaded_cudnn_9_is_the_silent_cpu_fallback(cuda_env):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, 90101)
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 1 and "cudnn.load" in failing(checks)
    assert checks["cudnn.load"]["found"].startswith("9.1.1 from ")
    assert "nvidia-cudnn-cu11==8.6.0.163" in checks["cudnn.load"]["remedy"]


def test_library_without_cudnnGetVersion_cannot_be_used(cuda_env):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, export=False)
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 1 and "cudnn.load" in failing(checks)
    assert "exports no cudnnGetVersion" in checks["cudnn.load"]["found"]


def test_no_loadable_cudnn_fails(cuda_env):
    site, bin_dir, manifest = cuda_env  # no library built at all
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 1 and checks["cudnn.load"]["found"].startswith("cannot load libcudnn")
    assert "Found cuDNN version 0" in checks["cudnn.load"]["expected"]


def test_scipy_113_fails_with_the_tril_reason(cuda_env):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, 8600)
    replace_dist(site, "scipy", "1.13.0")
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 1 and {"rule.scipy-tril", "pin.scipy"} <= failing(checks)
    assert "tril" in checks["rule.scipy-tril"]["expected"]
    assert checks["rule.scipy-tril"]["remedy"] == "pip install --no-deps scipy==1.12.0"


def test_jaxlib_older_than_jax_fails(cuda_env):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, 8600)
    replace_dist(site, "jaxlib", "0.4.19+cuda11.cudnn86")
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 1 and "rule.jax-jaxlib" in failing(checks)
    assert "jaxlib-0.4.20+cuda11.cudnn86" in checks["rule.jax-jaxlib"]["remedy"]


def test_octo_at_another_commit_fails(cuda_env):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, 8600)
    replace_dist(site, "octo", "0.1.0", commit="0" * 40)
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 1 and failing(checks) == {"git.octo"}
    assert "b14ec77d15ac30137c95b847f7fbaaf56f7eee8b" in checks["git.octo"]["remedy"]


def test_missing_octo_fails_on_a_gpu_node_and_warns_off_the_gpu(cuda12_env):
    # An image build or a login node without GitHub (--no-gpu): octo missing is a warning there, a failure where
    # the fine-tune runs; another commit fails either way.
    site, bin_dir, manifest = cuda12_env
    build_cudnn(site, 8907)
    for dist in site.glob("octo-*.dist-info"):
        shutil.rmtree(dist)
    rc, checks, _ = run_check(site, bin_dir, manifest, profile="cuda12")
    assert rc == 1 and failing(checks) == {"git.octo"}
    rc, checks, proc = run_check(site, bin_dir, manifest, "--no-gpu", profile="cuda12")
    assert rc == 0 and failing(checks) == set(), proc.stdout
    assert (
        checks["git.octo"]["status"] == "warn"
        and "make git-deps PROFILE=cuda12" in (checks["git.octo"]["remedy"])
    )
    replace_dist(site, "octo", "0.1.0", commit="0" * 40)
    rc, checks, _ = run_check(site, bin_dir, manifest, "--no-gpu", profile="cuda12")
    assert rc == 1 and failing(checks) == {"git.octo"}


def test_intended_cudnn_override_is_not_a_conflict_but_others_are(cuda_env):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, 8600)
    replace_dist(site, "jax", "0.4.20", requires=["nvidia-cudnn-cu11>=8.8"])
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 0 and "intended" in checks["deps.consistent"]["found"]
    make_dist(site, "somepkg", "1.0", requires=["numpy>=2"])
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 1 and failing(checks) == {"deps.consistent"}
    assert "somepkg 1.0 requires numpy>=2, found 1.24.3" in checks["deps.consistent"]["found"]


# ---- cuda12: the same rules for jax[cuda12] (PyPI's jaxlib + the CUDA 12 plugin) and the nvidia-*-cu12 wheels --


def test_correct_cuda12_environment_passes(cuda12_env):
    site, bin_dir, manifest = cuda12_env
    build_cudnn(site, 8907)
    rc, checks, proc = run_check(site, bin_dir, manifest, profile="cuda12")
    assert failing(checks) == set(), proc.stdout
    assert rc == 0
    pins = CUDA12.exact_pins()
    assert checks["pin.jaxlib"]["found"] == pins["jaxlib"] and "+" not in pins["jaxlib"]
    for name in ("jax", "jax-cuda12-plugin", "jax-cuda12-pjrt"):
        assert checks[f"pin.{name}"]["found"] == pins["jaxlib"]
    assert checks["pin.nvidia-cudnn-cu12"]["found"] == "8.9.7.29"
    assert checks["cudnn.wheel"]["status"] == "ok" and checks["cudnn.load"]["found"].startswith(
        "8.9.7 from "
    )
    # jaxlib's version carries no cuDNN tag here: the build comes from the plugin and the manifest's cudnn_build.
    assert (
        f"jax-cuda12-plugin {pins['jax-cuda12-plugin']} was built against 8.9"
        in checks["cudnn.wheel"]["expected"]
    )
    assert checks["rule.jax-jaxlib"]["status"] == "ok"
    assert not [i for i in checks if i.endswith("-cu11")]  # no cuda11 library asked for


def test_the_profile_is_inferred_from_the_cuda12_plugin(cuda12_env):
    site, bin_dir, manifest = cuda12_env
    build_cudnn(site, 8907)
    proc = run_check(site, bin_dir, manifest, profile=None)[2]
    assert json.loads(proc.stdout)["profile"] == "cuda12", proc.stdout
    # The same PyPI jaxlib without the plugin is a CPU install.
    for dist in site.glob("jax_cuda12_plugin-*.dist-info"):
        shutil.rmtree(dist)
    proc = run_check(site, bin_dir, manifest, profile=None)[2]
    assert json.loads(proc.stdout)["profile"] == "cpu", proc.stdout


def test_a_plugin_of_another_jax_release_fails_the_jax_jaxlib_rule(cuda12_env):
    site, bin_dir, manifest = cuda12_env
    build_cudnn(site, 8907)
    replace_dist(site, "jax-cuda12-plugin", "0.4.25")
    rc, checks, _ = run_check(site, bin_dir, manifest, profile="cuda12")
    assert rc == 1 and failing(checks) == {"rule.jax-jaxlib", "pin.jax-cuda12-plugin"}
    want = CUDA12.exact_pins()["jax-cuda12-plugin"]
    assert "jax-cuda12-plugin 0.4.25" in checks["rule.jax-jaxlib"]["found"]
    assert checks["rule.jax-jaxlib"]["remedy"] == f"pip install --no-deps jax-cuda12-plugin=={want}"
    # The PJRT half missing: the plugin cannot register a backend.
    replace_dist(site, "jax-cuda12-plugin", want)
    for dist in site.glob("jax_cuda12_pjrt-*.dist-info"):
        shutil.rmtree(dist)
    rc, checks, _ = run_check(site, bin_dir, manifest, profile="cuda12")
    assert rc == 1 and "jax-cuda12-pjrt not installed" in checks["rule.jax-jaxlib"]["found"]


def test_cudnn9_wheel_beside_cudnn89_jaxlib_fails_with_the_89_pin(cuda12_env):
    site, bin_dir, manifest = cuda12_env
    build_cudnn(site, 8907)
    replace_dist(site, "nvidia-cudnn-cu12", "9.1.0.70")
    rc, checks, _ = run_check(site, bin_dir, manifest, profile="cuda12")
    assert rc == 1
    assert failing(checks) == {"cudnn.wheel", "pin.nvidia-cudnn-cu12"}
    assert checks["cudnn.wheel"]["remedy"] == "pip install --no-deps nvidia-cudnn-cu12==8.9.7.29"
    assert "built against 8.9" in checks["cudnn.wheel"]["expected"]


def test_cudnn86_is_too_old_for_a_cudnn89_jaxlib(cuda12_env):
    # cuDNN 8.6 satisfies cuda11's jaxlib, not cuda12's: the minor must be >= the one it was built with.
    site, bin_dir, manifest = cuda12_env
    build_cudnn(site, 8600)
    replace_dist(site, "nvidia-cudnn-cu12", "8.6.0.163")
    rc, checks, _ = run_check(site, bin_dir, manifest, profile="cuda12")
    assert rc == 1 and {"cudnn.wheel", "cudnn.load"} <= failing(checks)
    assert checks["cudnn.load"]["expected"] == "8.x with minor >= 9"
    assert (
        checks["cudnn.load"]["remedy"]
        == "pip install --force-reinstall --no-deps nvidia-cudnn-cu12==8.9.7.29"
    )


def test_loaded_cudnn_9_beside_a_cuda12_jaxlib_is_the_silent_cpu_fallback(cuda12_env):
    site, bin_dir, manifest = cuda12_env
    build_cudnn(site, 90100)
    rc, checks, _ = run_check(site, bin_dir, manifest, profile="cuda12")
    assert rc == 1 and failing(checks) == {"cudnn.load"}
    assert checks["cudnn.load"]["found"].startswith("9.1.0 from ")


def test_a_cuda11_jaxlib_in_a_cuda12_environment_fails_with_the_cuda12_wheel(cuda12_env):
    site, bin_dir, manifest = cuda12_env
    build_cudnn(site, 8907)
    replace_dist(site, "jaxlib", "0.4.20+cuda11.cudnn86")
    rc, checks, _ = run_check(site, bin_dir, manifest, profile="cuda12")
    assert rc == 1 and "pin.jaxlib" in failing(checks)
    assert checks["pin.jaxlib"]["remedy"] == (
        f"pip install --no-deps jaxlib=={CUDA12.exact_pins()['jaxlib']}"
    )
    assert checks["rule.jax-jaxlib"]["status"] == "fail"
    # Its cuDNN is looked for in the cu11 wheel it was built for, which this environment lacks.
    assert checks["cudnn.wheel"]["found"] == "nvidia-cudnn-cu11 not installed"


def test_no_gpu_reports_the_gpu_checks_as_skipped_with_the_reason(cuda12_env):
    site, bin_dir, manifest = cuda12_env
    build_cudnn(site, 8907)
    (bin_dir / "nvidia-smi").unlink()  # a login node or an image build: no GPU, no nvidia-smi
    rc, checks, _ = run_check(site, bin_dir, manifest, profile="cuda12")
    assert rc == 1 and failing(checks) == {"gpu.visible"}
    rc, checks, proc = run_check(site, bin_dir, manifest, "--no-gpu", profile="cuda12")
    assert rc == 0 and failing(checks) == set(), proc.stdout
    assert checks["gpu.*"]["status"] == "skip" and "need a GPU node" in checks["gpu.*"]["found"]
    table = subprocess.run(
        [sys.executable, "-m", "octo_dist", "check-env", "--profile", "cuda12"]
        + ["--manifest", str(manifest), "--no-gpu"],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(site), PATH=f"{bin_dir}:{os.environ['PATH']}"),
        timeout=HANG_S,
    ).stdout
    assert "skip  gpu.*" in table and ", 1 skipped" in table, table


def test_cudnn_wheel_follows_the_jaxlib_build():
    assert rules.cudnn_wheel({"jaxlib": "0.4.20+cuda12.cudnn89"}, CUDA) == "nvidia-cudnn-cu12"
    assert rules.cudnn_wheel({}, CUDA12) == "nvidia-cudnn-cu12"  # from the profile's pinned plugin
    plugin = {"jaxlib": "0.4.23", "jax-cuda12-plugin": "0.4.23"}
    assert rules.cudnn_wheel(plugin, REAL.profile("cpu")) == "nvidia-cudnn-cu12"
    assert builds.jax_build(plugin, "8.9") == "0.4.23+cuda12.cudnn89"
    assert builds.jax_build(plugin) == "0.4.23+cuda12"
    assert builds.jax_build({"jaxlib": "0.4.20+cuda11.cudnn86", "jax-cuda12-plugin": "0.4.23"}) == (
        "0.4.20+cuda11.cudnn86"  # a CUDA jaxlib says its own build
    )
    assert builds.jax_build({"jaxlib": "0.4.22"}) == "0.4.22" and builds.jax_build({}) == ""
    assert builds.profile_for(builds.jax_build(plugin)) == "cuda12"
    assert rules.cudnn_wheel({"jaxlib": "0.4.22"}, CUDA) == "nvidia-cudnn-cu11"
    assert rules.cudnn_wheel({"jaxlib": "0.4.22"}, REAL.profile("cpu")) is None
    assert rules.cudnn_tag("0.4.20+cuda12.cudnn89") == (8, 9)
    assert rules.cudnn_compatible((8, 9), "8.9.7.29") and not rules.cudnn_compatible(
        (8, 9), "8.6.0"
    )


def test_no_gpu_and_hidden_gpus(cuda_env, tmp_path):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, 8600)
    rc, checks, _ = run_check(site, bin_dir, manifest, env_extra={"CUDA_VISIBLE_DEVICES": "0"})
    assert checks["gpu.cuda-visible-devices"]["status"] == "warn"
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\n")
    rc, checks, _ = run_check(site, bin_dir, manifest)
    assert rc == 1 and "gpu.visible" in failing(checks)


def test_real_cpu_venv_passes_with_git_deps_as_warnings():
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "check-env", "--profile", "cpu", "--json"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    report = json.loads(proc.stdout)
    checks = {c["id"]: c for c in report["checks"]}
    assert proc.returncode == 0, proc.stdout
    if checks["git.octo"]["status"] != "ok":
        assert (
            checks["git.octo"]["status"] == "warn"
            and checks["git.octo"]["found"] == "not installed"
        )
    assert checks["pin.jax"]["found"] == "0.4.22"


def test_usage_errors_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "check-env", "--profile", "cuda13"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "unknown profile 'cuda13'" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "check-env", "--manifest", str(tmp_path / "x.toml")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "no manifest at" in proc.stderr


def test_fast_mode_does_not_import_jax():
    code = (
        "import sys; from octo_dist.cli import main; rc = main(['check-env', '--profile', 'cpu', '--json']);"
        "print('JAX_IMPORTED', 'jax' in sys.modules, 'tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert "JAX_IMPORTED False False" in out


@pytest.mark.parametrize(
    "raw,want", [(8600, "8.6.0"), (91000, "9.10.0"), (90101, "9.1.1"), (8907, "8.9.7")]
)
def test_decode_cudnn_version(raw, want):
    assert cudnn.decode_version(raw) == want


def test_cudnn_tag_and_compatibility():
    assert rules.cudnn_tag("0.4.20+cuda11.cudnn86") == (8, 6)
    assert rules.cudnn_tag("0.4.22") is None
    assert rules.cudnn_compatible((8, 6), "8.9.6.5") and not rules.cudnn_compatible(
        (8, 6), "9.1.1.17"
    )
    assert not rules.cudnn_compatible((8, 6), "8.5.0.96")


def test_proxy_without_no_proxy_for_the_coordinator_warns():
    c = rules.check_proxy(
        {"HTTPS_PROXY": "http://proxy:3128", "COORDINATOR_ADDRESS": "g0001:12345"}
    )
    assert c.status == "warn" and "g0001" in c.remedy
    assert (
        rules.check_proxy(
            {
                "HTTPS_PROXY": "http://p:1",
                "NO_PROXY": "g0001,localhost",
                "COORDINATOR_ADDRESS": "g0001:1",
            }
        ).status
        == "ok"
    )
    assert rules.check_proxy({}) is None


@pytest.mark.parametrize("cvd", ["", "-1", "NoDevFiles"])
def test_cuda_visible_devices_hiding_every_gpu_fails(cuda_env, cvd):
    site, bin_dir, manifest = cuda_env
    build_cudnn(site, 8600)
    rc, checks, _ = run_check(site, bin_dir, manifest, env_extra={"CUDA_VISIBLE_DEVICES": cvd})
    assert rc == 1 and failing(checks) == {"gpu.cuda-visible-devices"}
    assert checks["gpu.cuda-visible-devices"]["remedy"] == "unset CUDA_VISIBLE_DEVICES"


def test_scan_reads_requirements_and_first_path_wins(tmp_path):
    from octo_dist.envcheck import installed

    a, b = tmp_path / "a", tmp_path / "b"
    make_dist(a, "scipy", "1.13.0", requires=["numpy >=1.22.4"])
    make_dist(b, "scipy", "1.12.0")
    found = installed.scan([str(a), str(b)])
    assert found["scipy"].version == "1.13.0" and found["scipy"].requires == ("numpy >=1.22.4",)


def test_deep_reports_the_backend_jax_really_ends_on():
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "check-env", "--profile", "cpu", "--deep", "--json"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    checks = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert checks["deep.backend"]["status"] == "ok"
    assert checks["deep.backend"]["found"].startswith("cpu backend, 1 device(s)")


def test_deep_fails_a_gpu_profile_that_ends_on_the_cpu():
    from octo_dist.envcheck import deep

    result = deep.parse_probe(
        'noise\nOCTO_DIST_DEEP {"backend": "cpu", "devices": ["TFRT_CPU_0"]}\n'
    )
    check = deep.judge(result, "", CUDA)
    assert check.status == "fail" and check.expected == "gpu backend"
    broken = deep.judge(
        None, "Traceback ...\nAttributeError: module 'scipy.linalg' has no attribute 'tril'", CUDA
    )
    assert broken.status == "fail" and "tril" in broken.found


@pytest.mark.parametrize(
    "edit",
    [
        ('gpu = true\nimage_base = "cuda11"', 'gpu = "false"\nimage_base = "cuda11"'),
        ("[profiles.cpu]\n", "profiles = 3\n[x]\n"),
        ("schema = 1", "schema = ["),
    ],
)
def test_a_broken_manifest_is_a_one_line_usage_error(tmp_path, edit):
    bad = tmp_path / "stack.toml"
    text = mf.DEFAULT_MANIFEST.read_text()
    assert text.count(edit[0]) == 1
    bad.write_text(text.replace(*edit))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "octo_dist",
            "check-env",
            "--profile",
            "cpu",
            "--manifest",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (
        proc.stderr
    )
    assert str(bad) in proc.stderr


def test_json_report_says_where_and_with_what_it_was_made():
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", "check-env", "--profile", "cpu", "--json"],
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    report = json.loads(proc.stdout)
    import octo_dist
    import platform
    import socket

    assert report["octo_dist_version"] == octo_dist.__version__ and report["schema"] == 1
    assert report["host"] == socket.gethostname() and report["python"] == platform.python_version()
    assert report["profile"] == "cpu" and report["gpu"] is False and report["checks"]


@pytest.mark.parametrize(
    "argv, env",
    [
        (["check-env", "--manifest", "{dir}"], {}),
        (["env", "--no-jax", "--manifest", "{dir}"], {}),
        (["check-env"], {"OCTO_DIST_MANIFEST": "{dir}"}),
        (["env", "--no-jax"], {"OCTO_DIST_MANIFEST": "{dir}"}),
    ],
    ids=["check-env", "env", "check-env-variable", "env-variable"],
)
def test_a_manifest_that_is_a_directory_is_a_one_line_usage_error(tmp_path, argv, env):
    """``OCTO_DIST_MANIFEST=env/`` (the folder instead of env/stack.toml): one line, exit 2, not IsADirectoryError."""
    proc = subprocess.run(
        [sys.executable, "-m", "octo_dist", *[a.format(dir=tmp_path) for a in argv]],
        capture_output=True,
        text=True,
        env={**os.environ, **{k: v.format(dir=tmp_path) for k, v in env.items()}},
        timeout=HANG_S,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"manifest {tmp_path} is a directory; expected the file env/stack.toml" in proc.stderr
    assert "Fix: pass --manifest /path/to/env/stack.toml" in proc.stderr


def test_an_endless_manifest_is_refused_without_reading_it_whole(tmp_path):
    # A device is refused before it is opened; a regular file is read to 1 MiB at most.
    with pytest.raises(mf.ManifestError, match=r"^manifest /dev/zero is not a regular file"):
        mf.load_manifest("/dev/zero")
    huge = tmp_path / "stack.toml"
    huge.write_bytes(b"# " + b"x" * (1 << 20) + b"\n")
    with pytest.raises(mf.ManifestError, match=rf"^manifest {huge} is longer than 1048576 bytes"):
        mf.load_manifest(str(huge))
