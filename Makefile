# octo-dist: every entry point a user or CI needs. `make help` lists them.
#
#   make smoke      build the cpu env if missing, run the 2-rank smoke job under the venv's mpirun
#   make test       build the cpu env + test tools if missing, run the test suite (what CI runs)
#
# PROFILE picks the stack from env/stack.toml (cpu: CI, laptops, the CPU image; cuda11: the researchers' CUDA 11.8
# stack; cuda12: CUDA 12 for ABCI 3.0's H200).
# PYTHON is the interpreter the venv is made from; its X.Y picks env/locks/<profile>-pyX.Y.txt.

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PROFILE ?= cpu
PYTHON ?= python3
VENV ?= .venv
PYTEST_ARGS ?=

PY_MM := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
LOCK := env/locks/$(PROFILE)-py$(PY_MM).txt
DEV_LOCK := env/locks/cpu-py$(PY_MM)-dev.txt
ENV_STAMP := $(VENV)/.octo-dist-$(PROFILE)-py$(PY_MM)
DEV_STAMP := $(VENV)/.octo-dist-dev-py$(PY_MM)
OCTO_DIST := $(VENV)/bin/octo-dist
# jax 0.4.20 on CPU wheels, for single-process sharding tests on the production pin (tests find it here).
JAX020_VENV ?= .venv-jax020
JAX020_STAMP := $(JAX020_VENV)/.octo-dist-jax020-cpu-py$(PY_MM)

.PHONY: help env dev-env jax020-env git-deps lock check-env test lint format test-repeat smoke bench-check-env bench-engine bench-startup bench-startup-fork clean-env

HELP_VARS := PROFILE PYTHON VENV JAX020_VENV IMAGE SIF SIF_DEF LOCAL_BASE LOCAL_SUITE
help: ## list the targets and the variables that change them (with their values now)
	@echo "usage: make TARGET [VARIABLE=value ...]"
	@echo
	@echo "variables (now):"
	@printf '  %-18s %s\n' \
	  PROFILE '$(PROFILE): the stack from env/stack.toml (cpu: CI, laptops, the CPU image; cuda11, cuda12: GPUs)' \
	  PYTHON '$(PYTHON) (Python $(or $(PY_MM),not found)): makes the venv; its X.Y picks $(LOCK)' \
	  VENV '$(VENV): the environment make env builds' \
	  PYTEST_ARGS '$(or $(PYTEST_ARGS),(none)): extra pytest arguments for make test / test-repeat' \
	  'N, HOGS' '$(N), $(HOGS): runs and CPU hogs of make test-repeat' \
	  BEFORE '$(BEFORE): the revision make bench-startup compares this tree with' \
	  FORK '$(or $(FORK),(none: the tree octo is imported from)): the fork source tree make bench-startup-fork runs'
	@echo
	@echo "targets:"
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) \
	  | sed $(foreach v,$(HELP_VARS),-e 's|$$($(v))|$($(v))|g') \
	  | awk -F':.*## ' '{ printf "  %-18s %s\n", $$1, $$2 }'

env: $(ENV_STAMP) ## build $(VENV) from the PROFILE's hashed lock (then git deps, then octo-dist, editable)

$(ENV_STAMP): $(LOCK) env/stack.toml pyproject.toml containers/install.sh
	PYTHON=$(PYTHON) containers/install.sh $(PROFILE) $(VENV) --editable
	touch $@

dev-env: $(ENV_STAMP) $(DEV_STAMP) ## add the test tools (pytest, hadolint, shellcheck, spython, uv) to $(VENV)

$(DEV_STAMP): $(DEV_LOCK) $(ENV_STAMP)
	$(VENV)/bin/python -m pip install --disable-pip-version-check --no-cache-dir --require-hashes --no-deps -r $(DEV_LOCK)
	touch $@

jax020-env: $(JAX020_STAMP) ## build $(JAX020_VENV): jax/jaxlib 0.4.20 CPU wheels for the single-process sharding tests

$(JAX020_STAMP): env/locks/jax020-cpu-py$(PY_MM).txt containers/install.sh
	PYTHON=$(PYTHON) containers/install.sh jax020-cpu $(JAX020_VENV) --skip-git --no-self
	touch $@

git-deps: $(ENV_STAMP) ## install the git-only packages (octo, dlimp) at their pinned commits; needs GitHub
	$(VENV)/bin/python -m octo_dist.stack.install --profile $(PROFILE) --only-git

lock: $(DEV_STAMP) ## regenerate env/locks/ from env/stack.toml (needs PyPI)
	PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/python scripts/lock.py

check-env: $(ENV_STAMP) ## check the environment against env/stack.toml (fast, no jax import)
	$(OCTO_DIST) check-env --profile $(PROFILE)

# As root with no PYTEST_ARGS (CI), tests/streams.py runs five pytests side by side, each cluster stream on a
# namespace cluster of its own (OCTOSIM_INSTANCE): the rest in the foreground, the cluster tests and the real
# Slurm, Grid Engine and PBS-imitation tests (their long scenarios too), each followed by some of the other tests
# so that the streams end together; their logs (.cluster/*.log) printed after; one exit status. A new test file
# lands in the rest. `python tests/streams.py --list` prints the commands. TEST_SPLIT=0 runs one pytest.
TEST_SPLIT ?= $(if $(and $(filter 0,$(shell id -u)),$(if $(PYTEST_ARGS),,1)),1,0)
test: $(DEV_STAMP) $(JAX020_STAMP) ## run the test suite (what CI runs; as root the cluster tests run beside the rest)
ifeq ($(TEST_SPLIT),1)
	$(VENV)/bin/python tests/streams.py
else
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)
endif

lint: $(DEV_STAMP) ## ruff check + ruff format --check (what make test's test_layers runs; rules in pyproject.toml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(DEV_STAMP) ## ruff format the tree, then ruff check --fix (100 columns; pyproject.toml [tool.ruff])
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Flakiness is a defect: run the tests that start several processes N times in a row, stopping at the first
# failure; HOGS=2 keeps that many CPU-bound processes busy beside them (a loaded machine), stopped afterwards.
N ?= 5
HOGS ?= 0
REPEAT_MARKERS ?= mpi
test-repeat: $(DEV_STAMP) $(JAX020_STAMP) ## run the REPEAT_MARKERS (mpi) tests N=5 times in a row beside HOGS=0 CPU hogs
	$(VENV)/bin/python tests/repeat.py --times $(N) --hogs $(HOGS) -- -m '$(REPEAT_MARKERS)' $(PYTEST_ARGS)

# The main job on its embedded default: 2 ranks under the venv's mpirun, checked against 1 process x 2 devices
# on the same global batches (octo-dist smoke --check-equivalence runs both). SMOKE_ARGS adds flags.
SMOKE_ARGS ?=
smoke: $(ENV_STAMP) ## build the cpu env if missing, run the 2-rank smoke job under mpirun, compare with 1 process
	$(OCTO_DIST) smoke --check-equivalence --np 2 $(SMOKE_ARGS)

# ---- Octo fine-tuning --------------------------------------------------------------------------------
# Compute nodes often have no internet: `make weights` on a login node puts HF_MODEL in WEIGHTS_DIR (and the
# tokenizer files its config names in ~/.cache/huggingface); jobs then use --config.pretrained_path=WEIGHTS_DIR.
HF_MODEL ?= hf://rail-berkeley/octo-small
WEIGHTS_DIR ?= weights/$(notdir $(HF_MODEL))
SYNTHETIC_DATA ?= runs/synthetic_rlds
FINETUNE_SMOKE_ARGS ?=
# Open MPI refuses root without these (containers, CI); harmless for everyone else.
MPIRUN_ROOT_ENV = OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

.PHONY: weights synthetic-data finetune-smoke

weights: $(ENV_STAMP) ## download HF_MODEL (octo-small) into WEIGHTS_DIR on a login node (needs huggingface.co)
	$(OCTO_DIST) weights $(HF_MODEL) $(WEIGHTS_DIR)

synthetic-data: $(ENV_STAMP) ## write the small synthetic RLDS dataset (TFRecords) to SYNTHETIC_DATA
	$(VENV)/bin/python -m octo_dist.apps.finetune.synthetic_rlds $(SYNTHETIC_DATA)

finetune-smoke: synthetic-data ## 2-rank Octo fine-tune of a tiny model on it under mpirun (needs octo: make git-deps)
	rm -rf runs/finetune-smoke
	$(MPIRUN_ROOT_ENV) $(VENV)/bin/mpirun --oversubscribe -np 2 $(OCTO_DIST) finetune \
	  --config=finetune_smoke_config.py --debug --config.dataset_kwargs.data_dir=$(SYNTHETIC_DATA) \
	  $(FINETUNE_SMOKE_ARGS)

bench-check-env: $(ENV_STAMP) ## median wall time of check-env vs `import jax`, side by side
	$(VENV)/bin/python bench/check_env.py

bench-engine: $(ENV_STAMP) ## per step function and model size (tiny, Octo-Small-sized): all-reduce bytes, step time 2 processes x 1 device vs 1 x 2, ratio, bandwidth vs loopback TCP
	PYTHONPATH=$(CURDIR) $(VENV)/bin/python bench/engine.py

# The last commit before the fine-tune data pipeline was built once per rank: what bench-startup compares with.
BEFORE ?= 6e80f81
bench-startup: $(ENV_STAMP) ## time to first step of smoke (and finetune where octo imports): this tree vs BEFORE=<rev>, side by side
	$(VENV)/bin/python bench/startup.py --before $(BEFORE)

bench-startup-fork: $(ENV_STAMP) ## time to first step, step time, memory of finetune: this tree vs the fork's scripts/finetune.py (FORK=<its tree>), side by side
	$(VENV)/bin/python bench/startup_fork.py $(if $(FORK),--fork $(FORK))

# The fine-tune's input pipeline on the window-2 + wrist config at realistic sizes: a synthetic RLDS dataset with
# 256x256 JPEG frames for both cameras (the wrist one resized to 128x128 on the host), camera-like noise; ours and
# the fork's (where octo imports) side by side. BENCH_INPUT_ARGS adds flags (--cores, --step-rate, --set ...).
BENCH_INPUT_DATA ?= runs/bench_input_rlds
BENCH_INPUT_ARGS ?=
.PHONY: bench-input
bench-input: $(ENV_STAMP) ## samples/s per core of the input pipeline, ours vs the fork's, its split, and whether a node feeds 8 GPUs
	$(VENV)/bin/python -m octo_dist.apps.finetune.synthetic_rlds $(BENCH_INPUT_DATA) --image-size 256 \
	  --wrist-size 256 --texture --train-episodes 20 --val-episodes 2 --steps 30
	PYTHONPATH=$(CURDIR) $(VENV)/bin/python bench/input.py $(BENCH_INPUT_DATA) \
	  --config=finetune_config.py:full,image_conditioned --set window_size=2 \
	  --set dataset_kwargs.name=octo_dist_synthetic --set dataset_kwargs.image_obs_keys.wrist=wrist_image \
	  $(BENCH_INPUT_ARGS)

clean-env: ## remove $(VENV)
	rm -rf $(VENV)

.PHONY: job-examples
job-examples: ## re-render scripts/jobs/*.sh with `octo-dist launch` (stdlib only; a test keeps them identical)
	PYTHONPATH=. $(PYTHON) -m octo_dist.jobs.examples scripts/jobs

# ---- validation on the first GPU node ------------------------------------------------------------------
# One process: check-env --deep, then the smoke job on 1 GPU vs every GPU of the node (scaling efficiency).
# VALIDATE_MPIRUN set: the same command again under that launcher (NCCL network between nodes, all-reduce).
# From the image: make validate-gpu VALIDATE_CMD="singularity exec --nv octo-dist-cuda12.sif octo-dist" \
#   VALIDATE_MPIRUN="mpirun -npernode 8 -hostfile $$PBS_NODEFILE"
VALIDATE_CMD ?= $(OCTO_DIST)
VALIDATE_MPIRUN ?=
VALIDATE_ARGS ?=

.PHONY: validate-gpu
validate-gpu: $(if $(filter $(OCTO_DIST),$(VALIDATE_CMD)),$(ENV_STAMP)) ## on a GPU node: check-env --deep, 1 vs all GPUs; VALIDATE_MPIRUN="mpirun ...": NCCL across nodes
	$(VALIDATE_CMD) validate $(VALIDATE_ARGS)
	$(if $(VALIDATE_MPIRUN),$(MPIRUN_ROOT_ENV) $(VALIDATE_MPIRUN) $(VALIDATE_CMD) validate $(VALIDATE_ARGS))

# ---- container images (Dockerfile targets cpu/cuda11/cuda12, singularity.def, singularity-cuda12.def) ----
# DOCKER can be podman or `buildah` (build-compatible). Behind a TLS-intercepting proxy, CA_SECRET=<bundle>
# passes its CA as a build secret (never a layer). SIF_TMPDIR: node-local disk on ABCI ($PBS_LOCALDIR).
DOCKER ?= docker
IMAGE ?= octo-dist
CA_SECRET ?=
# make sif: the cuda12 image from singularity-cuda12.def, what ABCI 3.0's H200 nodes (sm_90) need; make sif
# PROFILE=cuda11: the researchers' reference stack from singularity.def (V100/A100). The profile stays in the file
# name: `octo-dist launch --image` reads it there (a .sif's labels need singularity to read).
SIF_PROFILE = $(if $(filter cuda11,$(PROFILE)),cuda11,cuda12)
SIF_DEF = $(if $(filter cuda11,$(SIF_PROFILE)),singularity.def,singularity-$(SIF_PROFILE).def)
SIF ?= octo-dist-$(SIF_PROFILE).sif
SIF_TMPDIR ?= $${PBS_LOCALDIR:-/tmp}
REVISION = $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
CA_SECRET_ARG = --secret id=ca,src=$(CA_SECRET)
DOCKER_BUILD = $(DOCKER) build --build-arg REVISION=$(REVISION) $(if $(CA_SECRET),$(CA_SECRET_ARG))

.PHONY: images-check image-defs docker docker-smoke sif refresh-digests

images-check: ## check Dockerfile and singularity*.def against env/stack.toml (pins rendered, profile, install)
	PYTHONPATH=. $(PYTHON) -m octo_dist.stack.imagedefs check

image-defs: ## write the base images and version from env/stack.toml into Dockerfile and singularity*.def
	PYTHONPATH=. $(PYTHON) -m octo_dist.stack.imagedefs render

docker: images-check ## build image $(IMAGE):$(PROFILE) (Dockerfile target cpu, cuda11 or cuda12)
	$(DOCKER_BUILD) --target $(PROFILE) -t $(IMAGE):$(PROFILE) .

docker-smoke: ## build the cpu image and run the 2-rank smoke job in it under the image's mpirun
	$(MAKE) docker PROFILE=cpu
	$(DOCKER) run --rm $(IMAGE):cpu mpirun --oversubscribe -np 2 octo-dist smoke

sif: images-check ## build $(SIF) from $(SIF_DEF) with --fakeroot on a compute node (default cuda12, for H200; PROFILE=cuda11: cuda11)
	@PYTHONPATH=. $(PYTHON) -m octo_dist.jobs.buildsite $(SIF_PROFILE) '$(PROFILE)' '$(origin PROFILE)'
	@tool=$$(command -v singularity || command -v apptainer) || { \
	  echo "error: make sif needs singularity or apptainer on PATH; found neither." >&2; \
	  echo "  fix: on ABCI 3.0, SingularityCE 4.x is on the nodes without a module (elsewhere: module load singularitypro, or install SingularityCE 4.x or Apptainer)" >&2; \
	  exit 1; }; \
	tmp=$(SIF_TMPDIR); mkdir -p "$$tmp"; \
	echo "building $(SIF) with $$tool (temp dir $$tmp)"; \
	OCTO_DIST_REVISION=$(REVISION) SINGULARITY_TMPDIR="$$tmp" APPTAINER_TMPDIR="$$tmp" \
	  "$$tool" build --fakeroot $(SIF) $(SIF_DEF)

refresh-digests: ## re-resolve the base image digests in env/stack.toml, then render them into the definitions (needs crane/skopeo and a registry)
	PYTHONPATH=. $(PYTHON) -m octo_dist.stack.imagedefs refresh-digests

# The cpu image built for real where no registry and no Docker engine exist (CI here: tests marked `buildah`,
# built in the background by .ci/run): a Debian 12 base made with mmdebstrap (python3 = 3.11, so the cpu-py3.11
# lock), the same Dockerfile with only the base ARGs overridden, git deps skipped (no GitHub). Root, vfs, chroot.
# LOCAL_TARGET=cuda12 builds the cuda12 target the same way (it sits on the same plain base, with the cuda12-py3.11
# lock): opt-in, not in CI's run (about 3x the cpu image; docs/testing.md has its size and time).
BUILDAH ?= buildah --storage-driver vfs
LOCAL_BASE ?= localhost/octo-dist-local-base
LOCAL_SUITE ?= bookworm
DEBIAN_MIRROR ?= http://deb.debian.org/debian
LOCAL_CA ?= $${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
LOCAL_TMP ?= /var/tmp
# An existing base is kept, so a rebuild with nothing changed reuses every layer; LOCAL_BASE_REFRESH=1 remakes it.
LOCAL_BASE_REFRESH ?= 0

.PHONY: docker-local-base docker-local docker-local-smoke

docker-local-base: ## make $(LOCAL_BASE):$(LOCAL_SUITE) with mmdebstrap + buildah (root; no registry needed; kept if present)
	@for t in mmdebstrap buildah; do command -v $$t >/dev/null || { \
	  echo "error: make docker-local-base needs $$t; found none on PATH. fix: apt-get install -y buildah mmdebstrap (as root)" >&2; \
	  exit 1; }; done
	@if [ "$(LOCAL_BASE_REFRESH)" != 1 ] && $(BUILDAH) inspect --type image $(LOCAL_BASE):$(LOCAL_SUITE) >/dev/null 2>&1; then \
	  echo "docker-local-base: keeping $(LOCAL_BASE):$(LOCAL_SUITE) (LOCAL_BASE_REFRESH=1 remakes it)"; exit 0; fi; \
	tmp=$$(mktemp -d $(LOCAL_TMP)/octo-dist-base.XXXXXX); trap 'rm -rf "$$tmp"' EXIT; \
	mmdebstrap --quiet --mode=root --variant=minbase $(LOCAL_SUITE) "$$tmp/rootfs.tar" $(DEBIAN_MIRROR); \
	ctr=$$($(BUILDAH) from scratch); \
	$(BUILDAH) add "$$ctr" "$$tmp/rootfs.tar" /; \
	$(BUILDAH) config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$$ctr"; \
	$(BUILDAH) commit --rm "$$ctr" $(LOCAL_BASE):$(LOCAL_SUITE)

# --layers: each step a cached layer, so a rebuild with nothing changed reuses them all. With vfs every layer is a
# full copy of the root filesystem (3 GB from the venv's COPY on), so a one-off build (CI) passes
# LOCAL_LAYERS=--layers=false: one commit per stage.
LOCAL_LAYERS ?= --layers
LOCAL_TARGET ?= cpu
docker-local: ## build $(IMAGE):$(LOCAL_TARGET)-local (cpu; LOCAL_TARGET=cuda12) from the Dockerfile on that base, with buildah (the proxy CA as a build secret)
	@case "$(LOCAL_TARGET)" in cpu|cuda12) ;; *) \
	  echo "error: LOCAL_TARGET=$(LOCAL_TARGET); expected cpu or cuda12 (the Dockerfile targets on the plain base). fix: make docker-local LOCAL_TARGET=cuda12" >&2; \
	  exit 2 ;; esac
	@digest=$$($(BUILDAH) images --digests --format '{{.Digest}}' $(LOCAL_BASE):$(LOCAL_SUITE) 2>/dev/null) || { \
	  echo "error: no local base $(LOCAL_BASE):$(LOCAL_SUITE); fix: make docker-local-base" >&2; exit 1; }; \
	set -x; $(BUILDAH) bud --isolation chroot $(LOCAL_LAYERS) --format docker --target $(LOCAL_TARGET) \
	  --build-arg CPU_BASE_REPO=$(LOCAL_BASE) --build-arg CPU_BASE_TAG=$(LOCAL_SUITE) --build-arg CPU_BASE_DIGEST="$$digest" \
	  --build-arg GIT_DEPS=--skip-git --build-arg REVISION=$(REVISION) \
	  --secret id=ca,src=$(LOCAL_CA) -t $(IMAGE):$(LOCAL_TARGET)-local .

# The cpu image run as `docker run` runs it (its own entrypoint, command, user, workdir and env, from its
# configuration) in a chroot of its root filesystem: check-env, then the README's 2-rank smoke job.
docker-local-smoke: docker-local-base docker-local ## build $(IMAGE):cpu-local, run its default command and the 2-rank smoke job as docker run would
	PYTHONPATH=. $(PYTHON) -m tests.imagerun --image $(IMAGE):cpu-local
	PYTHONPATH=. $(PYTHON) -m tests.imagerun --image $(IMAGE):cpu-local -- mpirun --oversubscribe -np 2 octo-dist smoke

# ---- a cluster on one machine (root): the rendered PBS, Grid Engine and SLURM jobs run as deployed -------------------
# Two nodes as network + UTS + mount namespaces on a private link, ssh as a namespace agent; real Slurm 22.05 and
# Grid Engine 8.1.9 daemons on them, PBS's variables imitated, a Singularity stand-in, the image prefix built by
# containers/install.sh (tests/cluster/). The Debian packages: .ci/debian-packages.txt.
CLUSTER_ARGS ?=
.PHONY: cluster-smoke
cluster-smoke: $(DEV_STAMP) ## run the job scripts on a simulated 2-node cluster (root; tests marked cluster)
	status=0; OCTO_DIST_CLUSTER_LONG=1 $(VENV)/bin/python -m pytest -m cluster -rxXs -v tests/test_cluster.py tests/test_cluster_slurm.py tests/test_cluster_gridengine.py tests/test_cluster_mpi41.py tests/test_cluster_pbs.py $(CLUSTER_ARGS) || status=$$?; \
	  if [ -s .cluster/cluster-smoke.txt ]; then echo; cat .cluster/cluster-smoke.txt; fi; exit $$status
