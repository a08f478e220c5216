#!/usr/bin/env bash
# Install one profile of the pinned stack into a virtual environment.
#
# The one install path for every consumer: `make env` (a checkout, editable), the Dockerfile and
# singularity.def (an image, --require-git), and CI (a temporary prefix). The hashed lock goes first,
# then `python -m octo_dist.install` adds what the lock cannot hold (non-PyPI wheels, git deps) and
# octo-dist itself, and prints `pip freeze` into the log.
#
# usage: containers/install.sh PROFILE PREFIX [--editable] [--skip-git|--require-git] [--no-self]
#   PYTHON   interpreter to create PREFIX from (default: python3); its X.Y picks the lock file
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 PROFILE PREFIX [--editable] [--skip-git|--require-git] [--no-self]" >&2
  exit 2
fi
profile=$1
prefix=$2
shift 2
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}

if [ ! -x "$prefix/bin/python" ]; then
  "$python" -m venv "$prefix"
fi
py_mm=$("$prefix/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
lock="$src/env/locks/$profile-py$py_mm.txt"
if [ ! -f "$lock" ]; then
  echo "error: no lock for profile '$profile' on Python $py_mm (looked for $lock)" >&2
  echo "  available: $(cd "$src/env/locks" && ls -- *.txt | grep -v -- '-dev.txt' | tr '\n' ' ')" >&2
  echo "  fix: PYTHON=python3.10 $0 $profile $prefix   (or add $py_mm to lock_pythons in env/stack.toml and run make lock)" >&2
  exit 1
fi

echo "octo-dist: installing profile '$profile' for Python $py_mm from ${lock#"$src"/}"
"$prefix/bin/python" -m pip install --disable-pip-version-check --no-cache-dir \
  --require-hashes --no-deps -r "$lock"
PYTHONPATH="$src" "$prefix/bin/python" -m octo_dist.install --profile "$profile" --source "$src" "$@"
