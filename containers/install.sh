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

usage="usage: $0 PROFILE PREFIX [--editable] [--skip-git|--require-git] [--no-self]"
if [ $# -lt 2 ]; then
  echo "$usage" >&2
  exit 2
fi
profile=$1
prefix=$2
shift 2
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}

# Everything is checked before anything is written: a bad profile, Python or prefix leaves PREFIX as it was.
fail() {  # one line: what was found; expected; the fix. Exit 2.
  echo "error: $1" >&2
  exit 2
}
for arg in "$@"; do
  case $arg in
    --editable | --skip-git | --require-git | --no-self | --only-git) ;;
    *) fail "option '$arg'; expected --editable, --skip-git, --require-git, --no-self or --only-git. Fix: $usage" ;;
  esac
done
profiles=()
for f in "$src"/env/locks/*.txt; do
  case $f in *-dev.txt) ;; *) name=${f##*/}; profiles+=("${name%-py*.txt}") ;; esac
done
known=$(printf '%s\n' "${profiles[@]}" | sort -u | tr '\n' ' ')
case " $known " in
  *" $profile "*) ;;
  *) fail "no profile '$profile' (no lock env/locks/$profile-py*.txt); expected one of: ${known% }. Fix: $0 ${profiles[0]:-cpu} $prefix" ;;
esac
# A venv of ours to update (make env again): bin/python and pyvenv.cfg. Anything else that is not empty is refused.
if [ -e "$prefix" ] || [ -L "$prefix" ]; then
  if [ -L "$prefix" ] || [ ! -d "$prefix" ]; then
    fail "PREFIX $prefix exists and is not a directory; expected a new or empty directory, or a venv made by $0. Fix: pass another PREFIX"
  fi
  if [ -x "$prefix/bin/python" ] && [ -f "$prefix/pyvenv.cfg" ]; then
    python="$prefix/bin/python"
  elif [ -n "$(ls -A -- "$prefix")" ]; then
    fail "PREFIX $prefix is a directory that is not empty and not a venv (no bin/python and pyvenv.cfg); expected a new or empty directory, or a venv made by $0. Fix: pass a new PREFIX, e.g. $prefix/venv"
  fi
fi
if ! py_mm=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null); then
  fail "PYTHON=$python does not run; expected a Python 3 interpreter to make the venv from. Fix: PYTHON=python3.10 $0 $profile $prefix"
fi
lock="$src/env/locks/$profile-py$py_mm.txt"
if [ ! -f "$lock" ]; then
  available=""
  for f in "$src/env/locks/$profile"-py*.txt; do
    case $f in *-dev.txt) ;; *) available+="${f##*/} " ;; esac
  done
  first=${available%% *}
  first=${first#"$profile"-py}
  fail "no lock for profile '$profile' on Python $py_mm ($python); expected one of: ${available% }. Fix: PYTHON=python${first%.txt} $0 $profile $prefix, or add $py_mm to lock_pythons in env/stack.toml and run make lock"
fi
if [ ! -x "$prefix/bin/python" ]; then
  "$python" -m venv "$prefix"
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
