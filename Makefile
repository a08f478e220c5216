# octo-dist: every entry point a user or CI needs. `make help` lists them.
#
#   make smoke      build the cpu env if missing, run the 2-rank smoke job under the venv's mpirun
#   make test       build the cpu env + test tools if missing, run the test suite (what CI runs)
#
# PROFILE picks the stack from env/stack.toml (cpu: CI, laptops, the CPU image; cuda11: ABCI GPUs).
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

.PHONY: help env dev-env jax020-env git-deps lock check-env test smoke bench-check-env clean-env

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 18

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
	$(VENV)/bin/python -m octo_dist.install --profile $(PROFILE) --only-git

lock: $(DEV_STAMP) ## regenerate env/locks/ from env/stack.toml (needs PyPI)
	PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/python scripts/lock.py

check-env: $(ENV_STAMP) ## check the environment against env/stack.toml (fast, no jax import)
	$(OCTO_DIST) check-env --profile $(PROFILE)

test: $(DEV_STAMP) $(JAX020_STAMP) ## run the test suite (what CI runs)
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# The 2-rank data-parallel smoke job (issue 4) is not built yet; until it is, `make smoke` builds the
# env and checks it, as the foundation issue allows.
smoke: $(ENV_STAMP) ## build the cpu env if missing and check it (the 2-rank smoke job replaces this)
	$(OCTO_DIST) check-env --profile $(PROFILE)

bench-check-env: $(ENV_STAMP) ## median wall time of check-env vs `import jax`, side by side
	$(VENV)/bin/python bench/check_env.py

clean-env: ## remove $(VENV)
	rm -rf $(VENV)
