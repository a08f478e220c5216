"""The probe job's image branch, run by bash here: the script ``octo-dist probe`` renders for an image, with the
site's commands fabricated on PATH (``singularity``, ``qstat``, ``ompi_info``, ``show_quota``: each prints what
the real one prints, from recorded outputs) and the job's ``PBS_*`` variables set.

What it settles without the PBS imitation (whose jobs run as a user that cannot enter the image stand-in's mount
namespace, tests/cluster/container.py): the three commands meant for the image (``ls -l /dev/infiniband``,
``octo-dist check-env --deep --json``, the report's writer) run through ``singularity exec --nv --bind SAVE_DIR
IMAGE``, the report comes from inside the image when it starts, and from the node's own ``python3`` with the
checkout when it does not, naming what failed. Not settled here: ``--bind /dev/infiniband`` (added where the node
has the directory; this machine has none), and a real SingularityCE.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import HANG_S
from octo_dist.jobs import probe, probesite
from test_probe_facts import JOB_JSON, OMPI_TM, QUEUE_JSON, SHOW_QUOTA

IMAGE_BIN = str(Path(sys.executable).parent)  # the "image"'s octo-dist and python: this venv's
LOGIN = ("SingularityCE version 4.1.5-1.el9\n", 0)  # what the login node said at submit
# singularity: --version as SingularityCE 4.3 prints it on the compute nodes; exec runs the command with the
# image's PATH first, after checking the image file opens (SingularityCE: "FATAL: could not open image").
SINGULARITY = """#!/bin/bash
echo "$*" >> "$FAKE_SINGULARITY_LOG"
if [ "$1" = --version ]; then echo "SingularityCE version 4.3.1-1.el9"; exit 0; fi
[ "$1" = exec ] || exit 255
shift
while [ $# -gt 0 ]; do case $1 in --nv) shift ;; --bind) shift 2 ;; *) break ;; esac; done
image=$1; shift
[ -f "$image" ] || { echo "FATAL: could not open image $image: failed to retrieve path" >&2; exit 255; }
PATH="$FAKE_IMAGE_BIN:$PATH" exec "$@"
"""


def program(bin_dir: Path, name: str, body: str) -> None:
    (bin_dir / name).write_text(body)
    (bin_dir / name).chmod(0o755)


def printing(text: str) -> str:
    return f"#!/bin/sh\ncat <<'EOF'\n{text}\nEOF\n"


def run_probe(
    tmp_path: Path, *, node_python3: str = "", image_gone: bool = False
) -> tuple[dict, list[str], Path]:
    """Renders the 1-node probe for an image in ``tmp_path``, runs it as PBS would (its variables set, the site's
    commands on PATH), and returns its report, the singularity calls and the image. ``node_python3``: a python3
    of the node's in place of the system's (one that fails proves the image wrote the report); ``image_gone``: the
    image removed between the render and the job."""
    bin_dir, save, image = (
        tmp_path / "bin",
        tmp_path / "runs" / "probe",
        tmp_path / "octo-dist-cuda12.sif",
    )
    bin_dir.mkdir()
    program(bin_dir, "singularity", SINGULARITY)
    program(
        bin_dir,
        "qstat",
        f"#!/bin/sh\ncase \"$1\" in -Qf) cat <<'EOF'\n{QUEUE_JSON}\nEOF\n;; "
        f"*) cat <<'EOF'\n{JOB_JSON}\nEOF\n;; esac\n",
    )
    program(bin_dir, "ompi_info", printing(OMPI_TM))
    program(bin_dir, "show_quota", printing(SHOW_QUOTA))
    if node_python3:
        program(bin_dir, "python3", node_python3)
    image.write_text("a .sif\n")
    settings = probe.ProbeSettings("gxx00000", 1, str(save), str(image), None, (), "127.0.0.1:9")
    (tmp_path / "probe.sh").write_text(probe.render(settings, LOGIN))
    if image_gone:
        image.unlink()
    log = tmp_path / "singularity.log"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "JAX_PLATFORMS": "cpu",
        "PBS_JOBID": "12.pbs1",
        "PBS_QUEUE": "rt_HG",
        "FAKE_SINGULARITY_LOG": str(log),
        "FAKE_IMAGE_BIN": IMAGE_BIN,
    }
    job = ["bash", "probe.sh"]
    done = subprocess.run(
        job, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # set -u: a pbs.conf without PBS_EXEC (none here) beside another scheduler's /bin/qstat read as unbound
    assert "unbound variable" not in done.stderr, done.stderr
    report = json.loads((save / probesite.REPORT).read_text())
    return report, log.read_text().splitlines(), image


def test_the_image_runs_the_probes_commands_and_writes_its_report(tmp_path):
    """The node's python3 fails here: the report can only have come from the image."""
    report, calls, image = run_probe(tmp_path, node_python3="#!/bin/sh\nexit 97\n")
    save = tmp_path / "runs" / "probe"
    execs = [c for c in calls if c.startswith("exec ")]
    prefix = f"exec --nv --bind {save} {image} "
    assert [c[len(prefix) :].split()[:3] for c in execs] == [
        ["ls", "-l", "/dev/infiniband"],
        ["octo-dist", "check-env", "--deep"],
        ["python", "-m", "octo_dist.apps.probe.write"],
    ], calls
    assert all(c.startswith(prefix) for c in execs), execs
    facts = report["facts"]
    assert facts["check_env"]["exit"] == 0, facts["check_env"]
    assert (
        "absent" in facts["infiniband_image"]
    )  # ls ran, in the image: no /dev/infiniband on this machine
    assert facts["singularity_login"]["version"] == "4.1.5-1.el9"
    assert facts["singularity_compute"]["version"] == "4.3.1-1.el9"
    assert facts["kill_delay"]["seconds"] == 5 and facts["launcher"]["under_pbs"] is True
    assert facts["quota"]["areas"][0]["directory"] == "/groups/grpname"
    diffs = {d["fact"]: d for d in report["differences"]}
    assert set(diffs) == {"SingularityCE", "kill_delay", "outbound"}, report["differences"]
    assert "rt_HC" in diffs["SingularityCE"]["fix"]


def test_an_image_that_does_not_start_is_reported_by_the_nodes_python(tmp_path):
    """The image gone by the time the job runs: every command meant for it fails with SingularityCE's FATAL line,
    and the node's python3 (the system's) writes the report from the checkout, naming it."""
    report, calls, _ = run_probe(tmp_path, image_gone=True)
    facts = report["facts"]
    assert facts["check_env"]["exit"] == 255, facts["check_env"]
    assert "FATAL: could not open image" in facts["check_env"]["failed"][0]
    assert "FATAL: could not open image" in facts["infiniband_image"]["absent"]
    diffs = {d["fact"]: d for d in report["differences"]}
    assert "FATAL: could not open image" in diffs["check-env --deep"]["found"]
    assert sum(c.startswith("exec ") for c in calls) == 3, calls
