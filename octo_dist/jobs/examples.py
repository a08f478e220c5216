"""The ready-made job scripts in ``scripts/jobs/``, each rendered by ``octo-dist launch`` from the argv below.

    python -m octo_dist.jobs.examples scripts/jobs          # (re)write them: make job-examples
    python -m octo_dist.jobs.examples --check scripts/jobs  # exit 1 when one differs from what launch renders

Images and groups are placeholders for the cluster (``--skip-image-check``): re-render with your own.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

GROUP = "gxx00000"  # an ABCI group's shape; yours is in the ABCI user portal
IMAGE = f"/groups/{GROUP}/octo-dist/octo-dist-cuda12.sif"
OCTO_SMALL = "--config.pretrained_path=weights/octo-small"  # `make weights` on a login node: compute nodes are offline

# The fine-tune's run, the same on every cluster: the steps, the samples kept, where it saves and reads, online wandb.
FINETUNE_RUN = (
    "--steps 50000 --keep-samples-from 256 --save-dir runs/octo-small-ft --data-dir data --wandb-mode online "
    f"-- finetune {OCTO_SMALL}"
)
# file -> `octo-dist launch` argv, written as typed (no value holds a space). ABCI 3.0 (PBS) first, then Grid Engine
# (a PE named mpi) and SLURM.
EXAMPLES = {
    name: command.split()
    for name, command in {
        "abci3-pbs-smoke.sh": f"pbs --nodes 2 --group {GROUP} --walltime 0:30:00 --image {IMAGE} "
        "--skip-image-check --per-gpu-batch 4 --steps 200 --save-dir runs/smoke -- smoke --model auto",
        "abci3-pbs-finetune.sh": f"pbs --nodes 2 --group {GROUP} --walltime 12:00:00 --image {IMAGE} "
        f"--skip-image-check --per-gpu-batch 32 {FINETUNE_RUN}",
        "abci3-pbs-smoke-1gpu.sh": f"pbs --nodes 1 --resource-type rt_HG --group {GROUP} --walltime 0:20:00 "
        f"--image {IMAGE} --skip-image-check --steps 50 --save-dir runs/smoke-1gpu -- smoke --model auto",
        "sge-finetune.sh": "sge --nodes 2 --gpus-per-node 4 --module openmpi/4.1 --walltime 2:00:00 "
        "--global-batch 256 --steps 50000 --save-dir runs/octo-small-ft --data-dir data --wandb-mode online "
        f"-- finetune {OCTO_SMALL}",
        "slurm-finetune.sh": "slurm --nodes 2 --gpus-per-node 8 --walltime 12:00:00 --image "
        f"octo-dist-cuda12.sif --skip-image-check --per-gpu-batch 32 {FINETUNE_RUN}",
    }.items()
}


def rendered() -> dict:
    """file name -> the script ``octo-dist launch`` renders for it now."""
    from octo_dist.jobs.cli import parse
    from octo_dist.jobs.render import render

    return {name: render(parse(argv), name) for name, argv in EXAMPLES.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m octo_dist.jobs.examples",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("directory", nargs="?", default="scripts/jobs")
    p.add_argument("--check", action="store_true", help="compare instead of writing")
    args = p.parse_args(argv)
    out = Path(args.directory)
    stale = []
    for name, text in rendered().items():
        path = out / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
        print(f"wrote {path}")
    if stale:
        print(
            f"differ from `octo-dist launch`: {', '.join(stale)}. Fix: make job-examples",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
