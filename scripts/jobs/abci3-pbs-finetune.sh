#!/bin/bash
#PBS -P gxx00000
#PBS -q rt_HF
#PBS -l select=2:mpiprocs=8
#PBS -l walltime=12:00:00
#PBS -N octo-dist
#PBS -j oe
#PBS -k oe
# octo-dist job for PBS Professional (as on ABCI 3.0): 2 node(s) x 8 rank(s), one rank per GPU.
#   submit:    qsub abci3-pbs-finetune.sh
#   rendered:  octo-dist launch pbs --nodes 2 --walltime 12:00:00 --group gxx00000 --image /groups/gxx00000/octo-dist/octo-dist-cuda12.sif --skip-image-check --per-gpu-batch 32 --steps 50000 --keep-samples-from 256 --save-dir runs/octo-small-ft --data-dir data --wandb-mode online -- finetune --config.pretrained_path=weights/octo-small
# Re-render rather than edit: `octo-dist launch` refuses settings that would fail on the nodes.
# -j oe -k oe: one output file, written while the job runs (in your home directory) rather than copied at its end.
# shellcheck disable=SC2016,SC1003  # values below are single-quoted data: a '$' or '\' in them stays as it is
set -eo pipefail

# ---- rendered settings ---------------------------------------------------------------------------------------------
SCRIPT_NAME=abci3-pbs-finetune.sh
NODES=2
RANKS_PER_NODE=8
CPUS_PER_RANK=12  # cores bound to each rank for its input pipeline; 0: no binding
WALLTIME_S=43200
STOP_MARGIN_S=300  # the ranks are asked to checkpoint and stop this long before the wall time
STOP_TIMER=1  # 1: this script asks for the stop itself (the scheduler's own signal comes too late)
IMAGE=/groups/gxx00000/octo-dist/octo-dist-cuda12.sif  # a Singularity image; empty: run from VENV
VENV=.venv
BINDS=(/groups/gxx00000)  # bound into the image too, where they exist: shared weights, datasets and caches
SAVE_DIR=runs/octo-small-ft
DATA_DIR=data
COMPILE_CACHE=.octo-dist/compile-cache  # JAX's compilation cache, shared by the nodes and by later jobs; empty: off
MODULES=(hpcx/2.20)
WORKDIR="${PBS_O_WORKDIR:-$PWD}"
export WANDB_MODE=online
export NCCL_IB_HCA=${NCCL_IB_HCA:-mlx5_ibn1,mlx5_ibn2,mlx5_ibn3,mlx5_ibn4,mlx5_ibn5,mlx5_ibn6,mlx5_ibn7,mlx5_ibn8}  # NCCL's all-reduce over the 8 compute HCAs, not the storage one
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1}  # no download on every rank (compute nodes may be offline): weights and T5 tokenizer from `make weights` on a login node
# coordinator: octo-dist agrees one (mpi4py broadcast, else the node list's first host and a port from the job id)
# Where octo-dist's key file is; WANDB_API_KEY in the environment wins. Never put the key itself in this script.
WANDB_KEY_FILE=${WANDB_KEY_FILE:-$HOME/.config/octo-dist/wandb_api_key}

note() { echo "octo-dist job: $*" >&2; }
fail() { echo "octo-dist job: error: $*" >&2; exit 2; }

cd -- "$WORKDIR"
JOB=${PBS_JOBID:-0}  # the scheduler's job id
HOSTFILE=${PBS_NODEFILE:-}
if [ -z "$HOSTFILE" ] || [ ! -r "$HOSTFILE" ]; then
  fail "PBS_NODEFILE is '$HOSTFILE'; expected the node list the scheduler gives every job. Fix: submit it (qsub $SCRIPT_NAME) rather than running it"
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

# ---- directories, and the image or venv every rank starts from ------------------------------------------------------
mkdir -p -- "$SAVE_DIR"
SAVE_DIR=$(cd -- "$SAVE_DIR" && pwd)  # absolute: every node, and the image, see the same path
JOB_DIR=$SAVE_DIR/.octo-dist-job-$JOB  # this job's node list and the ranks' failure notes; removed at the end
mkdir -p -- "$JOB_DIR"
TIMER_PID=
# shellcheck disable=SC2317  # called from the trap below
cleanup() {
  local status=$?
  if [ -n "$TIMER_PID" ]; then kill -- "-$TIMER_PID" 2>/dev/null || true; fi
  rm -rf -- "$JOB_DIR"
  # For the next job of a chain (octo-dist launch --chain): 0 when this one finished or stopped for the wall time.
  echo "$status" >"$SAVE_DIR/.octo-dist-exit-$JOB" 2>/dev/null || true
}
trap cleanup EXIT
# A job of a chain trains only when the job before it did not fail (stopping for the wall time is not failing).
if [ -n "${OCTO_DIST_AFTER:-}" ]; then
  previous=$SAVE_DIR/.octo-dist-exit-$OCTO_DIST_AFTER
  if [ ! -f "$previous" ]; then
    note "the previous job of this chain ($OCTO_DIST_AFTER) left no exit status (ended by the scheduler?): resuming from the last checkpoint"
  elif [ "$(cat -- "$previous")" != 0 ]; then
    fail "the previous job of this chain ($OCTO_DIST_AFTER) failed with exit $(cat -- "$previous"): not training; expected it to finish or to stop for the wall time. Fix: read its log, then submit again (octo-dist launch ... --submit)"
  fi
fi
if [ -n "$DATA_DIR" ]; then
  [ -d "$DATA_DIR" ] || fail "data directory $DATA_DIR not found from $WORKDIR; expected the dataset directory. Fix: re-render with --data-dir PATH"
  DATA_DIR=$(cd -- "$DATA_DIR" && pwd)
fi
if [ -n "$COMPILE_CACHE" ]; then
  mkdir -p -- "$COMPILE_CACHE"
  COMPILE_CACHE=$(cd -- "$COMPILE_CACHE" && pwd)
fi
if [ -n "$IMAGE" ]; then
  [ -f "$IMAGE" ] || fail "image $IMAGE not found; expected the .sif this job was rendered for. Fix: copy it there, or re-render with --image PATH"
  IMAGE=$(cd -- "$(dirname -- "$IMAGE")" && pwd)/$(basename -- "$IMAGE")  # absolute, as the binds: every node sees it
  # An absolute path: the ranks on other nodes do not get this node's PATH from the module that provides it.
  SINGULARITY=$(type -P singularity) || fail "no singularity command; expected SingularityCE/PRO on the node. Fix: module load singularitypro (if your site has it), or re-render with --module"
  case "$SINGULARITY" in /*) ;; *) SINGULARITY=$PWD/$SINGULARITY ;; esac
  # --nv brings the host's NVIDIA driver in; the binds put checkpoints, data, the compilation cache, the job's node
  # list and the group area at the same paths inside.
  RUN=("$SINGULARITY" exec --nv --bind "$SAVE_DIR")
  if [ -n "$DATA_DIR" ]; then RUN+=(--bind "$DATA_DIR"); fi
  if [ -n "$COMPILE_CACHE" ]; then RUN+=(--bind "$COMPILE_CACHE"); fi
  for dir in "${BINDS[@]}"; do
    if [ -d "$dir" ]; then RUN+=(--bind "$(cd -- "$dir" && pwd)"); else note "not binding $dir: no such directory on this node"; fi
  done
  RUN+=("$IMAGE")
  BIN=
  # The image has no MPI library: octo-dist must not call into mpi4py there (it would fail, or hang in MPI_Init).
  export OCTO_DIST_NO_MPI4PY=1
else
  [ -x "$VENV/bin/python" ] || fail "no $VENV/bin/python; expected the octo-dist environment (make env PROFILE=cuda11). Fix: build it, or re-render with --venv PATH or --image FILE.sif"
  VENV=$(cd -- "$VENV" && pwd)
  RUN=()
  BIN=$VENV/bin/
fi

# ---- wandb: the key comes from the environment, or from a file only you can read ------------------------------------
if [ "$WANDB_MODE" = online ] && [ -z "${WANDB_API_KEY:-}" ]; then
  if [ -f "$WANDB_KEY_FILE" ]; then
    key_mode=$(stat -c %a -- "$WANDB_KEY_FILE")
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

# ---- the launcher: one rank per GPU, each with its own cores --------------------------------------------------------
SOCKETS=2  # CPU sockets of a node of this resource type; 0: unknown
# Exported variables with these prefixes, and these names, reach every rank on every node.
FORWARD_PREFIXES=(NCCL_ XLA_ JAX_ TF_ OCTO_DIST_ HF_ WANDB_ UCX_)
FORWARD_NAMES=(COORDINATOR_ADDRESS PYTHONUNBUFFERED)
NODE_LIST=$JOB_DIR/nodes
cp -- "$HOSTFILE" "$NODE_LIST"
export OCTO_DIST_NODEFILE=$NODE_LIST
BIND=(--map-by "ppr:$RANKS_PER_NODE:node" --bind-to none)
if [ "$CPUS_PER_RANK" -gt 0 ]; then
  cores_here=$(nproc)
  sockets_here=$(lscpu -p=SOCKET 2>/dev/null | grep -v '^#' | sort -u | wc -l || true)
  if [ "$cores_here" -lt $((CPUS_PER_RANK * RANKS_PER_NODE)) ]; then
    note "this node has $cores_here CPU(s), fewer than $RANKS_PER_NODE rank(s) x $CPUS_PER_RANK: not binding ranks to cores"
  elif [ "$SOCKETS" -gt 0 ] && [ "$sockets_here" -eq "$SOCKETS" ] && [ $((RANKS_PER_NODE % SOCKETS)) -eq 0 ]; then
    BIND=(--map-by "ppr:$((RANKS_PER_NODE / SOCKETS)):socket:PE=$CPUS_PER_RANK" --bind-to core)
  else
    BIND=(--map-by "ppr:$RANKS_PER_NODE:node:PE=$CPUS_PER_RANK" --bind-to core)
  fi
fi
# A node that stops answering (link down, panic) is noticed by mpirun's daemons through TCP keepalive; Open MPI's
# defaults (300 s, then 9 probes 20 s apart) hold a dead job for 8 minutes: 10 s and 3 probes 5 s apart instead.
# Open MPI 4 (hpcx) reads OMPI_MCA_*, Open MPI 5's PRRTE reads PRTE_MCA_*; each ignores the other's.
for param in keepalive_time=10 keepalive_intvl=5 keepalive_probes=3; do
  export "OMPI_MCA_oob_tcp_${param%%=*}=${param#*=}" "PRTE_MCA_oob_tcp_${param%%=*}=${param#*=}"
done
LAUNCHER=(mpirun -hostfile "$HOSTFILE" "${BIND[@]}" -x PBS_JOBID)
while IFS= read -r var; do
  for prefix in "${FORWARD_PREFIXES[@]}"; do
    if [[ "$var" == "$prefix"* ]]; then LAUNCHER+=(-x "$var"); continue 2; fi
  done
  for name in "${FORWARD_NAMES[@]}"; do
    if [ "$var" = "$name" ]; then LAUNCHER+=(-x "$var"); fi
  done
done < <(compgen -e)

PREFLIGHT=("${BIN}octo-dist" check-env --launch)
TRAIN=(
  "${BIN}octo-dist" finetune
  --config.batch_size=512 --config.num_steps=25000
  "--config.save_dir=$SAVE_DIR" "--config.dataset_kwargs.data_dir=$DATA_DIR" "--compile_cache=$COMPILE_CACHE"
  --config.pretrained_path=weights/octo-small
  --resume
)

# ---- stopping before the wall time ----------------------------------------------------------------------------------
# Every rank treats SIGUSR1 and SIGTERM alike: all ranks checkpoint at the next step boundary and exit 0. mpirun
# forwards SIGUSR1 (and SIGUSR2) to every rank but answers SIGTERM by killing the ranks within half a second (Open MPI
# 5.0.8, measured), so any stop signal this script gets becomes SIGUSR1 for the launcher. set -m gives the launcher its
# own process group: a signal for this script's group (Grid Engine's -notify, Ctrl-C) reaches the ranks once.
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
# A signal ignored when this script started stays ignored: a non-interactive bash can neither trap nor reset it.
# `job.sh &` from another script (POSIX: such a command ignores SIGINT), nohup, cron and some CI runners start it so.
# Linux lists the ignored signals in /proc as a hex mask, bit N-1 for signal N ("SigIgn: 0000000000000006": INT and
# QUIT). Each ignored stop signal is named once, with those that still stop the job; the timer below uses one of those.
IGNORED=()
STOPPING=()
sig_ign=$(sed -n 's/^SigIgn:[[:space:]]*//p' "/proc/$$/status" 2>/dev/null || true)
case "$sig_ign" in "" | *[!0-9a-fA-F]*) sig_ign=0 ;; esac
for sig in USR1 USR2 TERM INT; do
  if (((16#$sig_ign >> ($(kill -l "$sig") - 1)) & 1)); then IGNORED+=("SIG$sig"); else STOPPING+=("SIG$sig"); fi
done
if [ "${#IGNORED[@]}" -gt 0 ]; then
  note "warning: ${IGNORED[*]} ignored since this script started (run with '&' from a script, by nohup or a CI runner?) and a script cannot undo that: ${IGNORED[*]} will not stop this job; ${STOPPING[*]:-no signal} will${STOPPING[0]:+ (kill -${STOPPING[0]#SIG} $$)}. Fix: start it in the foreground, or after 'set -m' in the script that runs it with '&', or submit it"
fi
# PBS signals every process of the job at the wall time, mpirun included (which then kills the ranks at once), and
# Grid Engine's h_rt kills outright: so this script asks for the stop itself, STOP_MARGIN_S before the wall time.
if [ "$STOP_TIMER" = 1 ] && [ "${#STOPPING[@]}" -gt 0 ]; then
  (sleep $((WALLTIME_S - STOP_MARGIN_S)) && kill "-${STOPPING[0]#SIG}" $$) </dev/null >/dev/null 2>&1 &
  TIMER_PID=$!
  disown "$TIMER_PID"  # no "Terminated" notice when it is ended below
fi

# ---- a rank that fails ends the job ---------------------------------------------------------------------------------
# Each rank runs under this guard on its node: it passes the stop signals on and leaves a note in the job's directory
# (the save directory is shared by every node): in FAILED_DIR when the rank exits non-zero, in DONE_DIR when it exits 0.
# A launcher still running FAILED_GRACE_S after the first failure (mpirun waiting for a node it lost) is ended, so a
# dead job never holds its nodes until the wall time; a launcher that exits 0 while some rank never said it finished
# (mpirun gives up on a node it lost and may still exit 0) fails the job, naming the ranks that are missing.
FAILED_DIR=$JOB_DIR/failed
DONE_DIR=$JOB_DIR/done
FAILED_GRACE_S=20
RANK_GUARD=(bash -c 'dir=$1; shift
"$@" &
pid=$!
for sig in USR1 USR2 TERM INT; do trap "kill -$sig $pid 2>/dev/null" "$sig"; done
while :; do
  status=0; wait "$pid" || status=$?
  if [ "$status" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
  break
done
rank=${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:-${SLURM_PROCID:-${PMI_RANK:-unknown}}}}
if [ "$status" -ne 0 ]; then
  mkdir -p "$dir/failed" && echo "rank $rank on $(hostname) exited with status $status" >"$dir/failed/rank-$rank" || true
else
  mkdir -p "$dir/done" && echo "rank $rank on $(hostname)" >"$dir/done/rank-$rank" || true
fi
exit "$status"' octo-dist-rank "$JOB_DIR")

# shellcheck disable=SC2317  # called below
end_launcher() {  # a rank failed and the launcher has not ended the others by itself
  note "the launcher is still running ${FAILED_GRACE_S}s after a rank failed: ending it"
  kill -TERM -- "-$RANKS_PID" 2>/dev/null || true
  local waited=0
  while kill -0 "$RANKS_PID" 2>/dev/null && [ "$waited" -lt 10 ]; do sleep 1; waited=$((waited + 1)); done
  kill -KILL -- "-$RANKS_PID" 2>/dev/null || true
}

first_failure() {  # the oldest note: the rank that failed first, not one the launcher ended after it
  local first
  # shellcheck disable=SC2012  # the notes are named rank-N by the guard above
  first=$(ls -1tr -- "$FAILED_DIR" 2>/dev/null | head -n 1)
  if [ -n "$first" ]; then cat -- "$FAILED_DIR/$first" 2>/dev/null || true; fi
}

missing_ranks() {  # the ranks that left no note that they finished: "1 3"
  local rank missing=()
  for ((rank = 0; rank < NODES * RANKS_PER_NODE; rank++)); do
    [ -e "$DONE_DIR/rank-$rank" ] || missing+=("$rank")
  done
  echo "${missing[*]}"
}

run_ranks() {  # "$@": the command every rank runs
  rm -rf -- "$FAILED_DIR" "$DONE_DIR"
  "${LAUNCHER[@]}" "${RANK_GUARD[@]}" "${RUN[@]}" "$@" </dev/null &
  RANKS_PID=$!
  # A stop that came between the fork and the line above has not reached the launcher yet.
  if [ -n "$STOP" ]; then kill -USR1 "$RANKS_PID" 2>/dev/null || true; fi
  local status failed_at='' failure
  while kill -0 "$RANKS_PID" 2>/dev/null; do
    # `wait` on a sleep rather than the sleep itself: a trapped signal runs at once instead of after it.
    sleep 0.5 &
    wait $! || true
    if [ -z "$failed_at" ]; then
      failure=$(first_failure)
      if [ -n "$failure" ]; then failed_at=$SECONDS; note "$failure"; fi
    fi
    if [ -n "$failed_at" ] && [ $((SECONDS - failed_at)) -ge "$FAILED_GRACE_S" ] && kill -0 "$RANKS_PID" 2>/dev/null; then
      end_launcher
      break
    fi
  done
  status=0
  wait "$RANKS_PID" || status=$?
  if [ -z "$failed_at" ] && [ "$status" -ne 0 ]; then  # the launcher ended them itself: say which rank it was
    failure=$(first_failure)
    if [ -n "$failure" ]; then note "$failure"; fi
  fi
  # The rank that failed first decides the job's status and final line, not what the launcher exits with after it:
  # Open MPI 5.0.8's prterun may abort itself (134) while it ends a job whose rank refused to start (2).
  LAUNCHER_STATUS=$status
  RANK_FAILURE=${failure:-}
  case "${RANK_FAILURE##* }" in "" | *[!0-9]*) ;; *) status=${RANK_FAILURE##* } ;; esac
  if [ -n "$failed_at" ] && [ "$status" -eq 0 ]; then status=1; fi
  if [ "$status" -eq 0 ]; then
    local missing
    missing=$(missing_ranks)
    if [ -n "$missing" ]; then
      note "the launcher exited 0 but rank(s) $missing never finished (their node was lost, or they were killed): failing the job"
      status=1
    fi
  fi
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
# ": rank 1 on g0001 exited with status 2 (the launcher then exited with status 134)"; " (exit 1)" when no rank said.
outcome() {
  if [ -z "$RANK_FAILURE" ]; then echo " (exit $status)"; return; fi
  echo ": $RANK_FAILURE$([ "$LAUNCHER_STATUS" = "$status" ] || echo " (the launcher then exited with status $LAUNCHER_STATUS)")"
}
if [ "$status" -ne 0 ]; then
  note "preflight failed$(outcome): not training; its report above names the fix"
  exit "$status"
fi
note "training: ${TRAIN[*]}"
status=0
run_ranks "${TRAIN[@]}" || status=$?
note "training exited with $status after ${SECONDS}s${STOP:+ (stop requested by SIG$STOP)}${RANK_FAILURE:+$(outcome)}"
exit "$status"
