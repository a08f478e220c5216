#!/bin/bash
#PBS -P gxx00000
#PBS -q rt_HF
#PBS -l select=2:mpiprocs=8
#PBS -l walltime=12:00:00
#PBS -N octo-dist
#PBS -j oe
# octo-dist job for PBS Professional (ABCI 3.0): 2 node(s) x 8 rank(s), one rank per GPU.
#   submit:    qsub abci3-pbs-finetune.sh
#   rendered:  octo-dist launch pbs --nodes 2 --walltime 12:00:00 --group gxx00000 --image /groups/gxx00000/octo-dist/octo-dist_cuda11.sif --skip-image-check --per-gpu-batch 32 --steps 50000 --keep-samples-from 256 --save-dir runs/octo-small-ft --data-dir data --wandb-mode online -- finetune --config.pretrained_path=weights/octo-small
# Re-render rather than edit: `octo-dist launch` refuses settings that would fail on the nodes.
set -eo pipefail

# ---- rendered settings ---------------------------------------------------------------------------------------------
NODES=2
RANKS_PER_NODE=8
WALLTIME_S=43200
STOP_MARGIN_S=300  # the ranks are asked to checkpoint and stop this long before the wall time
STOP_TIMER=1  # 1: this script asks for the stop itself (the scheduler's own signal comes too late)
IMAGE=/groups/gxx00000/octo-dist/octo-dist_cuda11.sif  # a Singularity image; empty: run from VENV
VENV=.venv
SAVE_DIR=runs/octo-small-ft
DATA_DIR=data
MODULES=(hpcx/2.20)
WORKDIR="${PBS_O_WORKDIR:-$PWD}"
export WANDB_MODE=online
export HF_HUB_OFFLINE=1  # no download on every rank (compute nodes may be offline): weights and T5 tokenizer from `make weights` on a login node
# coordinator: octo-dist agrees one (mpi4py broadcast, else the node list's first host and a port from the job id)
# Where octo-dist's key file is; WANDB_API_KEY in the environment wins. Never put the key itself in this script.
WANDB_KEY_FILE=${WANDB_KEY_FILE:-$HOME/.config/octo-dist/wandb_api_key}

note() { echo "octo-dist job: $*" >&2; }
fail() { echo "octo-dist job: error: $*" >&2; exit 2; }

cd "$WORKDIR"
HOSTFILE=${PBS_NODEFILE:-}
if [ -z "$HOSTFILE" ] || [ ! -r "$HOSTFILE" ]; then
  fail "PBS_NODEFILE is '$HOSTFILE'; expected the node list the scheduler gives every job. Fix: submit it (qsub abci3-pbs-finetune.sh) rather than running it"
fi
hosts_found=$(awk 'NF && !seen[$1]++' "$HOSTFILE" | wc -l)
if [ "$hosts_found" -ne "$NODES" ]; then
  note "warning: $HOSTFILE lists $hosts_found node(s); this script was rendered for $NODES"
fi

# ---- modules: hpcx's mpirun is built for the nodes' InfiniBand ------------------------------------------------------
# `module` is a shell function from the site's profile; where there is none (a laptop, CI) the launcher on PATH is used.
if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; then
  # shellcheck source=/dev/null
  . /etc/profile.d/modules.sh
fi
if [ "${#MODULES[@]}" -gt 0 ]; then
  if command -v module >/dev/null 2>&1; then
    module load "${MODULES[@]}"
  else
    note "no 'module' command here: not loading ${MODULES[*]}"
  fi
fi
command -v mpirun >/dev/null 2>&1 || fail "no mpirun on PATH (after loading: ${MODULES[*]:-no modules}); expected the launcher of the job's MPI. Fix: module load the site's MPI (ABCI: hpcx), or re-render with --module NAME"

# ---- directories, and the container or venv every rank starts from --------------------------------------------------
mkdir -p "$SAVE_DIR"
SAVE_DIR=$(cd "$SAVE_DIR" && pwd)  # absolute: every node, and the container, see the same path
if [ -n "$DATA_DIR" ]; then
  [ -d "$DATA_DIR" ] || fail "data directory $DATA_DIR not found from $WORKDIR; expected the dataset directory. Fix: re-render with --data-dir PATH"
  DATA_DIR=$(cd "$DATA_DIR" && pwd)
fi
if [ -n "$IMAGE" ]; then
  [ -f "$IMAGE" ] || fail "image $IMAGE not found; expected the .sif this job was rendered for. Fix: copy it there, or re-render with --image PATH"
  command -v singularity >/dev/null 2>&1 || fail "no singularity command; expected SingularityCE/PRO on the node. Fix: module load singularitypro (ABCI 2.0), or re-render with --module"
  # --nv brings the host's NVIDIA driver in; the binds put checkpoints (and the ranks' node list) and data at the
  # same paths inside.
  binds=("$SAVE_DIR")
  if [ -n "$DATA_DIR" ]; then binds+=("$DATA_DIR"); fi
  RUN=(singularity exec --nv --bind "$(IFS=,; echo "${binds[*]}")" "$IMAGE")
  BIN=
else
  [ -x "$VENV/bin/python" ] || fail "no $VENV/bin/python; expected the octo-dist environment (make env PROFILE=cuda11). Fix: build it, or re-render with --venv PATH or --image FILE.sif"
  VENV=$(cd "$VENV" && pwd)
  RUN=()
  BIN=$VENV/bin/
fi

# ---- wandb: the key comes from the environment, or from a file only you can read ------------------------------------
if [ "$WANDB_MODE" = online ] && [ -z "${WANDB_API_KEY:-}" ]; then
  if [ -f "$WANDB_KEY_FILE" ]; then
    key_mode=$(stat -c %a "$WANDB_KEY_FILE")
    case "$key_mode" in
      [4-7]00) ;;
      *) fail "$WANDB_KEY_FILE has mode $key_mode; expected 600 or 400 (readable by you only). Fix: chmod 600 $WANDB_KEY_FILE" ;;
    esac
    WANDB_API_KEY=$(tr -d '[:space:]' <"$WANDB_KEY_FILE")
    export WANDB_API_KEY
  elif ! grep -qs 'api.wandb.ai' "$HOME/.netrc"; then
    fail "WANDB_MODE=online but no wandb key: WANDB_API_KEY is unset, $WANDB_KEY_FILE does not exist and ~/.netrc has no api.wandb.ai entry. Fix: (umask 077; cat >$WANDB_KEY_FILE) and paste the key, or wandb login, or re-render with --wandb-mode offline"
  fi
fi

# ---- the launcher: one rank per GPU ---------------------------------------------------------------------------------
NODE_LIST=$SAVE_DIR/.octo-dist-nodes-${PBS_JOBID:-0}
cp "$HOSTFILE" "$NODE_LIST"
LAUNCHER=(mpirun -npernode "$RANKS_PER_NODE" -hostfile "$HOSTFILE" --bind-to none -x PBS_NODEFILE="$NODE_LIST")
for var in WANDB_MODE WANDB_API_KEY COORDINATOR_ADDRESS OCTO_DIST_INIT_TIMEOUT PBS_JOBID HF_HUB_OFFLINE; do
  if [ -n "${!var:-}" ]; then LAUNCHER+=(-x "$var"); fi
done

PREFLIGHT=("${BIN}octo-dist" check-env --launch)
TRAIN=(
  "${BIN}python" scripts/finetune.py
  --config.batch_size=512 --config.num_steps=25000
  "--config.save_dir=$SAVE_DIR" "--config.dataset_kwargs.data_dir=$DATA_DIR"
  --config.pretrained_path=weights/octo-small
  --resume
)

# ---- stopping before the wall time ----------------------------------------------------------------------------------
# Every rank treats SIGUSR1 and SIGTERM alike: all ranks checkpoint at the next step boundary and exit 0. mpirun
# forwards SIGUSR1 (and SIGUSR2) to every rank but answers SIGTERM by killing the ranks within half a second (Open MPI
# 5.0.8, measured), so any stop signal this script gets becomes SIGUSR1 for the launcher. set -m gives the launcher its
# own process group: a signal for this script's group (SGE's -notify, Ctrl-C) reaches the ranks once, as SIGUSR1.
set -m
RANKS_PID=
STOP=
# shellcheck disable=SC2317  # called from the traps below
stop_ranks() {
  note "SIG$1 after ${SECONDS}s: asking every rank to checkpoint and stop"
  STOP=$1
  if [ -n "$RANKS_PID" ]; then kill -USR1 "$RANKS_PID" 2>/dev/null || true; fi
}
trap 'stop_ranks TERM' TERM
trap 'stop_ranks USR1' USR1
trap 'stop_ranks USR2' USR2
trap 'stop_ranks INT' INT
# PBS signals every process of the job at the wall time, mpirun included (which then kills the ranks at once), and
# SGE's h_rt kills outright: so this script asks for the stop itself, STOP_MARGIN_S before the wall time.
TIMER_PID=
if [ "$STOP_TIMER" = 1 ]; then
  (sleep $((WALLTIME_S - STOP_MARGIN_S)) && kill -USR1 $$) </dev/null >/dev/null 2>&1 &
  TIMER_PID=$!
fi
# shellcheck disable=SC2317  # called from the trap below
cleanup() {
  if [ -n "$TIMER_PID" ]; then kill -- "-$TIMER_PID" 2>/dev/null || true; fi
  if [ -n "${NODE_LIST:-}" ]; then rm -f "$NODE_LIST"; fi
}
trap cleanup EXIT

run_ranks() {  # "$@": the command every rank runs
  "${LAUNCHER[@]}" "${RUN[@]}" "$@" </dev/null &
  RANKS_PID=$!
  # A stop that came between the fork and the line above has not reached the launcher yet.
  if [ -n "$STOP" ]; then kill -USR1 "$RANKS_PID" 2>/dev/null || true; fi
  local status
  while :; do
    status=0
    wait "$RANKS_PID" || status=$?
    # A trapped signal ends `wait` early (status > 128) while the launcher still runs: wait again for its own status.
    if [ "$status" -gt 128 ] && kill -0 "$RANKS_PID" 2>/dev/null; then continue; fi
    break
  done
  RANKS_PID=
  return "$status"
}

note "$NODES node(s) x $RANKS_PER_NODE rank(s); preflight: ${PREFLIGHT[*]}"
status=0
run_ranks "${PREFLIGHT[@]}" || status=$?
if [ -n "$STOP" ]; then
  note "stop requested during the preflight: not training"
  exit 0
fi
if [ "$status" -ne 0 ]; then
  note "preflight failed (exit $status): not training; its report above names the fix"
  exit "$status"
fi
note "training: ${TRAIN[*]}"
status=0
run_ranks "${TRAIN[@]}" || status=$?
note "training exited with $status after ${SECONDS}s${STOP:+ (stop requested by SIG$STOP)}"
exit "$status"
