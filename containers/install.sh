#!/usr/bin/env bash
# Install one profile of the pinned stack into a virtual environment.
#
# The one install path for every consumer: `make env` (a checkout, editable), the Dockerfile and
# singularity.def (an image, --require-git), and CI (a temporary prefix). The hashed lock goes first,
# then `python -m octo_dist.stack.install` adds what the lock cannot hold (non-PyPI wheels, git deps) and
# octo-dist itself, and prints `pip freeze` into the log.
#
# usage: containers/install.sh PROFILE PREFIX [--editable] [--skip-git|--require-git] [--no-self]
#   PYTHON        interpreter to create PREFIX from (default: python3); its X.Y picks the lock file
#   OCTO_DIST_CA  a CA bundle for pip and git, for a TLS-intercepting proxy. Images pass it as a build
#                 secret (/run/secrets/ca), so it is used for this run and never stored in a layer.
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
  available=()
  for f in "$src"/env/locks/*.txt; do
    case $f in *-dev.txt) ;; *) available+=("${f##*/}") ;; esac
  done
  echo "  available: ${available[*]}" >&2
  echo "  fix: PYTHON=python3.10 $0 $profile $prefix   (or add $py_mm to lock_pythons in env/stack.toml and run make lock)" >&2
  exit 1
fi

if [ -n "${OCTO_DIST_CA:-}" ]; then
  if [ -s "$OCTO_DIST_CA" ]; then
    export PIP_CERT=$OCTO_DIST_CA GIT_SSL_CAINFO=$OCTO_DIST_CA
  else
    # An optional build secret that was not passed: the default trust store it is.
    echo "octo-dist: OCTO_DIST_CA=$OCTO_DIST_CA is missing or empty; using the default CA bundle" >&2
  fi
fi

echo "octo-dist: installing profile '$profile' for Python $py_mm from ${lock#"$src"/}"
# The lock's own hash in the build log: which lock an image was built from, not just its name.
sha256sum "$lock"
"$prefix/bin/python" -m pip install --disable-pip-version-check --no-cache-dir \
  --require-hashes --no-deps -r "$lock"
# From $src: `python -m` puts the working directory first on sys.path, so another checkout's octo_dist
# there would otherwise read that checkout's manifest instead of the one being installed.
prefix_python=$(cd "$prefix" && pwd)/bin/python
cd "$src"
PYTHONPATH="$src" "$prefix_python" -m octo_dist.stack.install --profile "$profile" --source "$src" "$@"
