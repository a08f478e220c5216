"""jax[cuda12] without a GPU: octo-dist's start-up says so in one line and JAX runs on the CPU.

The real plugin (jax-cuda12-plugin 0.4.23) makes the first ``jax.devices()`` raise ``Unable to initialize backend
'cuda': FAILED_PRECONDITION: No visible GPU devices`` on a machine without a GPU. Its stand-in here is a
``jax_plugins.xla_cuda12`` package that registers a ``cuda`` backend failing the same way, discovered by JAX's own
plugin discovery, beside a ``jax-cuda12-plugin`` dist-info: the start-up under test is the product's, unchanged.
"""

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from octo_dist.stack import cudaplugin
from helpers import HANG_S

PLUGIN = "jax-cuda12-plugin 0.4.23"
# JAX 0.4.23's message for the plugin's backend on a machine without a GPU, as raised by xla_bridge.backends().
NO_GPU_ERROR = (
    "Unable to initialize backend 'cuda': FAILED_PRECONDITION: No visible GPU devices. (you may need to "
    "uninstall the failing plugin package, or set JAX_PLATFORMS=cpu to skip this backend.)"
)

FAKE_PLUGIN = """
import jax._src.xla_bridge as xb


def initialize():
    def factory():
        raise RuntimeError("FAILED_PRECONDITION: No visible GPU devices.")

    # As the real plugin registers it (xla_bridge.register_plugin): priority 500, never failing quietly.
    xb.register_backend_factory("cuda", factory, priority=500, fail_quietly=False)
"""


def test_the_plugin_is_found_by_its_distribution():
    versions = {"jax-cuda12-plugin": "0.4.23"}

    def version(name):
        if name not in versions:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    assert cudaplugin.installed_plugin(version) == PLUGIN
    versions.clear()
    assert cudaplugin.installed_plugin(version) is None


def test_gpu_devices_are_the_driver_device_files(tmp_path):
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).write_text("")
    found = cudaplugin.gpu_devices(str(tmp_path / "nvidia[0-9]*"))
    assert [os.path.basename(p) for p in found] == ["nvidia0", "nvidia1"]
    assert cudaplugin.gpu_devices(str(tmp_path / "none[0-9]*")) == []


def test_cpu_fallback_only_for_a_plugin_without_devices_and_no_platform_chosen():
    line = cudaplugin.cpu_fallback({}, PLUGIN, [])
    assert line and "\n" not in line
    assert (
        "no NVIDIA GPU on this machine" in line and PLUGIN in line and "JAX runs on the CPU" in line
    )
    assert (
        cudaplugin.cpu_fallback({}, PLUGIN, ["/dev/nvidia0"]) is None
    )  # a GPU node: CUDA or an error
    assert cudaplugin.cpu_fallback({}, None, []) is None  # PyPI's CPU jaxlib alone: nothing to say
    assert cudaplugin.cpu_fallback({"JAX_PLATFORMS": "cpu"}, PLUGIN, []) is None
    assert cudaplugin.cpu_fallback({"JAX_PLATFORMS": "cuda"}, PLUGIN, []) is None  # JAX's own error
    assert cudaplugin.cpu_fallback({"JAX_PLATFORMS": ""}, PLUGIN, []) is not None


def test_a_cuda_backend_that_fails_beside_gpus_is_one_line_with_the_fix():
    line = cudaplugin.backend_error(RuntimeError(NO_GPU_ERROR), PLUGIN, ["/dev/nvidia0"])
    assert line and "\n" not in line
    assert "did not start with 1 NVIDIA device(s) here (/dev/nvidia0)" in line
    assert (
        "FAILED_PRECONDITION: No visible GPU devices. Expected" in line
        and "you may need" not in line
    )
    assert "--nv" in line and "check-env --deep" in line
    assert cudaplugin.backend_error(RuntimeError("something else"), PLUGIN, []) is None
    assert cudaplugin.backend_error(RuntimeError(NO_GPU_ERROR), None, []) is None


@pytest.fixture
def fake_plugin_site(tmp_path) -> Path:
    site = tmp_path / "site"
    pkg = site / "jax_plugins" / "xla_cuda12"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_PLUGIN)
    info = site / "jax_cuda12_plugin-0.4.23.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: jax-cuda12-plugin\nVersion: 0.4.23\n"
    )
    return site


def _run(site: Path, code: str, **env_extra) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "OMPI_", "PMI"))}
    env.update(PYTHONPATH=f"{site}{os.pathsep}{Path(__file__).resolve().parents[1]}", **env_extra)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_S
    )


@pytest.mark.skipif(
    bool(cudaplugin.gpu_devices()), reason="this machine has an NVIDIA GPU: no CPU fallback"
)
def test_the_stand_in_plugin_fails_plain_jax_as_the_real_one_does(fake_plugin_site):
    proc = _run(fake_plugin_site, "import jax; jax.devices()")
    assert proc.returncode != 0
    assert "Unable to initialize backend 'cuda'" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(
    bool(cudaplugin.gpu_devices()), reason="this machine has an NVIDIA GPU: no CPU fallback"
)
def test_start_up_says_one_line_and_runs_on_the_cpu(fake_plugin_site):
    code = (
        "from octo_dist.runtime import runtime\n"
        "rt = runtime.initialize(launcher='single')\n"
        "import jax\n"
        "print('PLATFORM', rt.platform, float(jax.numpy.ones(3).sum()))\n"
    )
    proc = _run(fake_plugin_site, code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "PLATFORM cpu 3.0" in proc.stdout
    said = [ln for ln in proc.stderr.splitlines() if "no NVIDIA GPU on this machine" in ln]
    assert len(said) == 1 and PLUGIN in said[0], proc.stderr
    for noise in ("Unable to initialize backend", "An NVIDIA GPU may be present", "Traceback"):
        assert noise not in proc.stderr, proc.stderr
    # The user's choice stands: JAX_PLATFORMS=cpu runs on the CPU without the line.
    proc = _run(fake_plugin_site, code, JAX_PLATFORMS="cpu")
    assert proc.returncode == 0 and "PLATFORM cpu 3.0" in proc.stdout, proc.stderr[-2000:]
    assert "no NVIDIA GPU" not in proc.stderr


def test_start_up_beside_a_gpu_device_fails_in_one_line_instead_of_falling_back(fake_plugin_site):
    # The machine's device files are what this test fabricates: a GPU node where the CUDA backend cannot start.
    code = (
        "from octo_dist.stack import cudaplugin\n"
        "cudaplugin.gpu_devices = lambda *a: ['/dev/nvidia0']\n"
        "from octo_dist.runtime import runtime\n"
        "try:\n"
        "    runtime.initialize(launcher='single')\n"
        "except runtime.StartupError as e:\n"
        "    print('REFUSED', e)\n"
    )
    proc = _run(fake_plugin_site, code)
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED")]
    assert len(refused) == 1, proc.stdout + proc.stderr[-2000:]
    assert "did not start with 1 NVIDIA device(s) here (/dev/nvidia0)" in refused[0]
    assert "no NVIDIA GPU on this machine" not in proc.stderr
