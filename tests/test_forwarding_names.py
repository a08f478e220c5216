"""What the job forwards to every rank by name (mpirun's ``-x``, PBS's ``-v``): TensorFlow's variables, never
another tool's that shares their ``TF_`` prefix (Terraform's)."""

from __future__ import annotations

from octo_dist.jobs.cli import parse
from octo_dist.jobs.schedulers import mpirun

ENV = {
    # TensorFlow's (read by tf.data in the input pipeline)
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "TF_CPP_VMODULE": "dataset=1",
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    "TF_NUM_INTEROP_THREADS": "4",
    # Terraform's: a login node where the user also runs terraform
    "TF_CLI_CONFIG_FILE": "/home/u/.terraformrc",
    "TF_LOG": "DEBUG",
    "TF_VAR_region": "ap-northeast-1",
    "TF_DATA_DIR": "/home/u/.terraform.d",
}


def test_tensorflows_names_are_forwarded_and_terraforms_are_not():
    job = parse(["sge", "--nodes", "2", "--gpus-per-node", "1"])
    f = job.settings.forwarding
    argv = mpirun.forwarded(ENV, f.forward_prefixes, f.forward_names)
    named = set(argv[1::2])
    assert named == {
        "TF_CPP_MIN_LOG_LEVEL",
        "TF_CPP_VMODULE",
        "TF_FORCE_GPU_ALLOW_GROWTH",
        "TF_NUM_INTEROP_THREADS",
    }, argv
