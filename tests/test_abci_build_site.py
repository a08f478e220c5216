"""``make sif`` builds on a compute node, not on a login node.

ABCI 3.0 user guide, system-overview: "if you run a high-load task on the interactive node, the system will
forcibly terminate it"; its containers page builds images inside ``qsub -I -P GROUP -q rt_HC -l select=1``.
"""

import os
import subprocess

from helpers import HANG_S, REPO, clean_env
from octo_dist.jobs import buildsite


def refusal(env, pbs_client=True):
    return buildsite.login_node_refusal(
        env, pbs_client, "login1", "cuda12", "/groups/gxx00000/octo-dist"
    )


def test_a_login_node_refuses_with_the_interactive_compute_node_command():
    problem = refusal({"USER": "u"})
    assert problem is not None and problem.exit_status == 2
    text = str(problem)
    assert text.startswith(
        "make sif on login1, a login node (a PBS client here, and no PBS job: PBS_JOBID"
    ), text
    assert "will forcibly terminate" in text
    assert (
        "Fix: qsub -I -P GROUP -q rt_HC -l select=1 -l walltime=2:00:00, then in that shell: "
        "cd /groups/gxx00000/octo-dist && make sif PROFILE=cuda12"
    ) in text, text


def test_a_pbs_job_a_host_without_pbs_and_the_override_build():
    assert refusal({"PBS_JOBID": "12345.pbs1"}) is None
    assert refusal({}, pbs_client=False) is None
    assert refusal({"OCTO_DIST_SIF_ON_LOGIN_NODE": "1"}) is None


def test_make_sif_stops_before_building_on_a_login_node(tmp_path):
    """The Makefile's recipe runs the check before anything else: a fake qsub on PATH makes this a login node, and
    a fake singularity that records a call shows none was made."""
    tools = tmp_path / "bin"
    tools.mkdir()
    called = tmp_path / "singularity-called"
    (tools / "qsub").write_text("#!/bin/sh\nexit 0\n")
    (tools / "singularity").write_text(f"#!/bin/sh\ntouch {called}\n")
    for tool in ("qsub", "singularity"):
        (tools / tool).chmod(0o755)
    env = clean_env(PATH=f"{tools}:{os.environ['PATH']}")
    env.pop("PBS_JOBID", None)
    proc = subprocess.run(
        ["make", "--no-print-directory", "sif", "PROFILE=cuda12", f"SIF={tmp_path / 'x.sif'}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )
    assert proc.returncode != 0 and "make sif: error: make sif on " in proc.stderr, proc.stderr
    assert "-q rt_HC" in proc.stderr and not called.exists()


def test_make_sif_with_a_profile_that_has_no_image_is_refused(tmp_path):
    """`make sif PROFILE=cpu` (or a typo) built the cuda12 image without a word; PROFILE=cuda11 and the default
    still go on (here to the login-node check, which a fake qsub triggers, so nothing is built)."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "qsub").write_text("#!/bin/sh\nexit 0\n")
    (tools / "qsub").chmod(0o755)
    env = clean_env(PATH=f"{tools}:{os.environ['PATH']}")
    env.pop("PROFILE", None)

    def make(*args):
        return subprocess.run(
            ["make", "--no-print-directory", "sif", *args, f"SIF={tmp_path / 'x.sif'}"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_S,
        ).stderr

    for wrong in ("cpu", "cuda13"):
        err = make(f"PROFILE={wrong}")
        assert (
            f"make sif: error: make sif PROFILE={wrong}; expected a profile make sif builds" in err
        ), err
        assert "Fix: make sif PROFILE=cuda12" in err
    for fine in (("PROFILE=cuda11",), ()):
        assert "a login node" in make(*fine)
