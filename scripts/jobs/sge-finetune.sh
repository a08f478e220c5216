#!/bin/bash
#$ -pe mpi 8
#$ -l h_rt=02:00:00
#$ -N octo-dist
#$ -j y
#$ -cwd
#$ -notify
# shellcheck disable=SC2016,SC1003  # values below are single-quoted data: a '$' or '\' in them stays as it is
# octo-dist job for Grid Engine: 2 node(s) x 4 rank(s), 1 GPU(s) per rank.
#   submit:    qsub sge-finetune.sh
#   rendered:  octo-dist launch sge --nodes 2 --gpus-per-node 4 --walltime 2:00:00 --module openmpi/4.1 --global-batch 256 --steps 50000 --save-dir runs/octo-small-ft --data-dir data --wandb-mode online -- finetune --config.pretrained_path=weights/octo-small
# Re-render rather than edit: `octo-dist launch` refuses settings that would fail on the nodes.
# After `module load`, octo-dist's job runtime (Python) checks the job, runs `octo-dist check-env --launch`, then
# "train" on every rank under mpirun. Any stop signal makes every rank checkpoint and stop (so does its timer,
# 300 s before the wall time).
# A rank that fails or never finishes fails the job. Its settings are the JSON below.
set -eo pipefail
cd -- "$PWD"
# `module` is the site profile's shell function; none (a laptop, CI): the launcher on PATH is used.
# shellcheck source=/dev/null
if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; then . /etc/profile.d/modules.sh; fi
if command -v module >/dev/null 2>&1; then module load openmpi/4.1; else printf '%s\n' "octo-dist job: no 'module' command here: not loading "'openmpi/4.1' >&2; fi
[ -x .venv/bin/python ] || { printf '%s\n' "octo-dist job: error: no "'.venv/bin/python'"; expected the octo-dist environment (make env PROFILE=cuda12). Fix: build it, or re-render with --venv PATH or --image FILE.sif" >&2; exit 2; }
exec .venv/bin/python -m octo_dist.jobs.supervisor supervise '{"schema": 2, "script_name": "sge-finetune.sh",
 "allocation": {"scheduler": "sge", "nodes": 2, "ranks_per_node": 4, "cpus_per_rank": 0, "sockets": 0},
 "timing": {"walltime_s": 7200, "stop_margin_s": 300},
 "software": {"modules": ["openmpi/4.1"], "image": "", "venv": ".venv", "binds": []},
 "storage": {"save_dir": "runs/octo-small-ft", "data_dir": "data", "compile_cache": ".octo-dist/compile-cache", "wandb_mode": "online"},
 "forwarding": {"environment": [["HF_HUB_OFFLINE", "1"]], "coordinator": "", "forward_prefixes": ["NCCL_", "XLA_", "JAX_", "TF_CPP_", "OCTO_DIST_", "HF_", "WANDB_", "UCX_"], "forward_names": ["COORDINATOR_ADDRESS", "PYTHONUNBUFFERED", "TF_ENABLE_ONEDNN_OPTS", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR", "TF_GPU_THREAD_COUNT", "TF_GPU_THREAD_MODE", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_DETERMINISTIC_OPS", "TF_XLA_FLAGS"]},
 "commands": {"preflight": ["octo-dist", "check-env", "--launch"], "train": ["octo-dist", "finetune", "--config.batch_size=256", "--config.num_steps=50000", "--config.save_dir=@{save_dir}", "--config.dataset_kwargs.data_dir=@{data_dir}", "--compile_cache=@{compile_cache}", "--config.pretrained_path=weights/octo-small", "--resume"]}}'
