#!/bin/bash
#PBS -P gxx00000
#PBS -q rt_HF
#PBS -l select=2:mpiprocs=8
#PBS -l place=scatter
#PBS -l walltime=12:00:00
#PBS -N octo-dist
#PBS -j oe
#PBS -k oe
# shellcheck disable=SC2016,SC1003  # values below are single-quoted data: a '$' or '\' in them stays as it is
# octo-dist job for PBS Professional (as on ABCI 3.0): 2 node(s) x 8 rank(s), 1 GPU(s) per rank.
#   submit:    qsub abci3-pbs-finetune.sh
#   rendered:  octo-dist launch pbs --nodes 2 --walltime 12:00:00 --group gxx00000 --image /groups/gxx00000/octo-dist/octo-dist-cuda12.sif --skip-image-check --per-gpu-batch 32 --steps 50000 --keep-samples-from 256 --save-dir runs/octo-small-ft --data-dir data --wandb-mode online -- finetune --config.pretrained_path=weights/octo-small
# Re-render rather than edit: `octo-dist launch` refuses settings that would fail on the nodes.
# After `module load`, octo-dist's job runtime (Python) checks the job, runs `octo-dist check-env --launch`, then
# "train" on every rank under mpirun. Any stop signal makes every rank checkpoint and stop (so does its timer,
# 300 s before the wall time).
# A rank that fails or never finishes fails the job. Its settings are the JSON below.
set -eo pipefail
cd -- "${PBS_O_WORKDIR:-$PWD}"
# `module` is the site profile's shell function; none (a laptop, CI): the launcher on PATH is used.
# shellcheck source=/dev/null
if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; then . /etc/profile.d/modules.sh; fi
if command -v module >/dev/null 2>&1; then module load hpcx/2.20; else printf '%s\n' "octo-dist job: no 'module' command here: not loading "'hpcx/2.20' >&2; fi
[ -f /groups/gxx00000/octo-dist/octo-dist-cuda12.sif ] || { printf '%s\n' "octo-dist job: error: image "'/groups/gxx00000/octo-dist/octo-dist-cuda12.sif'" not found from $PWD; expected the .sif this job was rendered for. Fix: copy it there, or re-render with --image PATH" >&2; exit 2; }
RUNTIME=${OCTO_DIST_RUNTIME:-$PWD/.octo-dist-runtime.pyz}  # the job runtime: the image's (octo-dist job-runtime -o FILE)
[ -n "${OCTO_DIST_RUNTIME:-}" ] || singularity exec /groups/gxx00000/octo-dist/octo-dist-cuda12.sif octo-dist job-runtime -o "$RUNTIME" >/dev/null
python3 -c 'import sys, zipfile; sys.exit(not zipfile.is_zipfile(sys.argv[1]))' "$RUNTIME" 2>/dev/null || { printf '%s\n' "octo-dist job: error: the job runtime $RUNTIME is not a complete zipapp (empty, or cut short); expected the file octo-dist job-runtime writes. Fix: unset OCTO_DIST_RUNTIME, or write it again (singularity exec IMAGE octo-dist job-runtime -o FILE)" >&2; exit 2; }
exec python3 "$RUNTIME" supervise '{"schema": 2, "script_name": "abci3-pbs-finetune.sh",
 "allocation": {"scheduler": "pbs", "nodes": 2, "ranks_per_node": 8, "cpus_per_rank": 12, "sockets": 2},
 "timing": {"walltime_s": 43200, "stop_margin_s": 300},
 "software": {"modules": ["hpcx/2.20"], "image": "/groups/gxx00000/octo-dist/octo-dist-cuda12.sif", "venv": ".venv", "binds": ["/groups/gxx00000", "/dev/infiniband", "weights/octo-small"]},
 "storage": {"save_dir": "runs/octo-small-ft", "data_dir": "data", "compile_cache": ".octo-dist/compile-cache", "wandb_mode": "online"},
 "forwarding": {"environment": [["NCCL_IB_HCA", "mlx5_ibn1,mlx5_ibn2,mlx5_ibn3,mlx5_ibn4,mlx5_ibn5,mlx5_ibn6,mlx5_ibn7,mlx5_ibn8"], ["HF_HUB_OFFLINE", "1"]], "coordinator": "", "forward_prefixes": ["NCCL_", "XLA_", "JAX_", "TF_CPP_", "OCTO_DIST_", "HF_", "WANDB_", "UCX_"], "forward_names": ["COORDINATOR_ADDRESS", "PYTHONUNBUFFERED", "TF_ENABLE_ONEDNN_OPTS", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR", "TF_GPU_THREAD_COUNT", "TF_GPU_THREAD_MODE", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_DETERMINISTIC_OPS", "TF_XLA_FLAGS"]},
 "commands": {"preflight": ["octo-dist", "check-env", "--launch"], "train": ["octo-dist", "finetune", "--config.batch_size=512", "--config.num_steps=25000", "--config.save_dir=@{save_dir}", "--config.dataset_kwargs.data_dir=@{data_dir}", "--compile_cache=@{compile_cache}", "--config.pretrained_path=weights/octo-small", "--resume"]}}'
