#!/bin/bash
#SBATCH --job-name=octo-dist
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --time=12:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --output=octo-dist-%j.out
# shellcheck disable=SC2016,SC1003  # values below are single-quoted data: a '$' or '\' in them stays as it is
# octo-dist job for SLURM: 2 node(s) x 8 rank(s), 1 GPU(s) per rank.
#   submit:    sbatch slurm-finetune.sh
#   rendered:  octo-dist launch slurm --nodes 2 --gpus-per-node 8 --walltime 12:00:00 --image octo-dist-cuda12.sif --skip-image-check --per-gpu-batch 32 --steps 50000 --keep-samples-from 256 --save-dir runs/octo-small-ft --data-dir data --wandb-mode online -- finetune --config.pretrained_path=weights/octo-small
# Re-render rather than edit: `octo-dist launch` refuses settings that would fail on the nodes.
# After `module load`, octo-dist's job runtime (Python) checks the job, runs `octo-dist check-env --launch`, then
# "train" on every rank under srun. Any stop signal makes every rank checkpoint and stop.
# A rank that fails or never finishes fails the job. Its settings are the JSON below.
set -eo pipefail
cd -- "${SLURM_SUBMIT_DIR:-$PWD}"
# `module` is the site profile's shell function; none (a laptop, CI): the launcher on PATH is used.
# shellcheck source=/dev/null
if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; then . /etc/profile.d/modules.sh; fi
# no modules to load (--module ''): the launcher and python3 on PATH are used
[ -f octo-dist-cuda12.sif ] || { printf '%s\n' "octo-dist job: error: image "'octo-dist-cuda12.sif'" not found from $PWD; expected the .sif this job was rendered for. Fix: copy it there, or re-render with --image PATH" >&2; exit 2; }
RUNTIME=${OCTO_DIST_RUNTIME:-$PWD/.octo-dist-runtime.pyz}  # the job runtime: the image's (octo-dist job-runtime -o FILE)
[ -n "${OCTO_DIST_RUNTIME:-}" ] || singularity exec octo-dist-cuda12.sif octo-dist job-runtime -o "$RUNTIME" >/dev/null
python3 -c 'import sys, zipfile; sys.exit(not zipfile.is_zipfile(sys.argv[1]))' "$RUNTIME" 2>/dev/null || { printf '%s\n' "octo-dist job: error: the job runtime $RUNTIME is not a complete zipapp (empty, or cut short); expected the file octo-dist job-runtime writes. Fix: unset OCTO_DIST_RUNTIME, or write it again (singularity exec IMAGE octo-dist job-runtime -o FILE)" >&2; exit 2; }
exec python3 "$RUNTIME" supervise '{"schema": 2, "script_name": "slurm-finetune.sh",
 "allocation": {"scheduler": "slurm", "nodes": 2, "ranks_per_node": 8, "cpus_per_rank": 0, "sockets": 0},
 "timing": {"walltime_s": 43200, "stop_margin_s": 300},
 "software": {"modules": [], "image": "octo-dist-cuda12.sif", "venv": ".venv", "binds": ["weights/octo-small"]},
 "storage": {"save_dir": "runs/octo-small-ft", "data_dir": "data", "compile_cache": ".octo-dist/compile-cache", "wandb_mode": "online"},
 "forwarding": {"environment": [["HF_HUB_OFFLINE", "1"]], "coordinator": "", "forward_prefixes": ["NCCL_", "XLA_", "JAX_", "TF_CPP_", "OCTO_DIST_", "HF_", "WANDB_", "UCX_"], "forward_names": ["COORDINATOR_ADDRESS", "PYTHONUNBUFFERED", "TF_ENABLE_ONEDNN_OPTS", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR", "TF_GPU_THREAD_COUNT", "TF_GPU_THREAD_MODE", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_DETERMINISTIC_OPS", "TF_XLA_FLAGS"]},
 "commands": {"preflight": ["octo-dist", "check-env", "--launch"], "train": ["octo-dist", "finetune", "--config.batch_size=512", "--config.num_steps=25000", "--config.save_dir=@{save_dir}", "--config.dataset_kwargs.data_dir=@{data_dir}", "--compile_cache=@{compile_cache}", "--config.pretrained_path=weights/octo-small", "--resume"]}}'
