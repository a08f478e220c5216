#!/usr/bin/env bash
# Build OpenPBS (the open-source PBS Professional) from ../shared/thirdparty/ for the real-PBS cluster tests
# (tests/cluster/pbs.py), or reuse the build already installed. Root only: it installs Debian's build
# dependencies and writes the versioned prefix below, the one cache CI keeps outside the clone.
#
#   tests/cluster/openpbs-build.sh            build unless the prefix holds a complete build; print the prefix
#   tests/cluster/openpbs-build.sh --prefix   print the prefix only
#
# OCTO_DIST_THIRDPARTY: the folder holding openpbs-$COMMIT.tar.gz (default: shared/thirdparty beside the clone).
# OCTO_DIST_OPENPBS_PREFIX: where to install (default below; tests/cluster/pbs.py reads the same variable).
# Nothing is configured here (no pbs.conf, no /etc, no daemons): the tests write their pbs.conf per run.
set -euo pipefail

VERSION=23.06.06
COMMIT=cd7ab5e
SHA256=008f253774cf9e64f56c7e254913c9ef5306068f68e1be84a0924d7005c71287
# The recipe's own version: raise it whenever this script builds differently, so CI rebuilds.
RECIPE=b2
PREFIX=${OCTO_DIST_OPENPBS_PREFIX:-/opt/octo-dist-ci/openpbs-$VERSION-$COMMIT-$RECIPE}
MARKER=$PREFIX/.octo-dist-build-complete

if [ "${1:-}" = --prefix ]; then
  echo "$PREFIX"
  exit 0
fi

root=$(cd "$(dirname "$0")/../.." && pwd)
thirdparty=${OCTO_DIST_THIRDPARTY:-$root/../shared/thirdparty}
tarball=$thirdparty/openpbs-$COMMIT.tar.gz

if [ -f "$MARKER" ]; then
  echo "openpbs: reusing $PREFIX ($(cat "$MARKER"))"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "openpbs: not built at $PREFIX, and building needs root: run sudo $0" >&2
  exit 2
fi
if [ ! -r "$tarball" ]; then
  echo "openpbs: no source at $tarball; expected OpenPBS $VERSION there (set OCTO_DIST_THIRDPARTY to its folder)" >&2
  exit 2
fi

# One build at a time: a second caller waits, then finds the marker.
mkdir -p "$(dirname "$PREFIX")"
exec 9> "$(dirname "$PREFIX")/.openpbs-build.lock"
flock 9
if [ -f "$MARKER" ]; then
  echo "openpbs: reusing $PREFIX ($(cat "$MARKER"))"
  exit 0
fi

got=$(sha256sum "$tarball" | cut -d' ' -f1)
if [ "$got" != "$SHA256" ]; then
  echo "openpbs: $tarball has sha256 $got, expected $SHA256 (OpenPBS $VERSION at $COMMIT); restore the file" >&2
  exit 2
fi

# Build dependencies, from OpenPBS's INSTALL (Debian), named as bookworm names them. The run-time ones
# (postgresql, libical3, libcjson1) are in .ci/debian-packages.txt. No sendmail: the tests read no mail.
build_deps=(gcc g++ make libtool autoconf automake perl swig pkg-config libhwloc-dev libx11-dev libxt-dev
  libedit-dev libical-dev libncurses-dev postgresql-server-dev-all postgresql postgresql-contrib python3-dev
  tcl-dev tk-dev libexpat1-dev libssl-dev libxext-dev libxft-dev libcjson-dev zlib1g-dev)
missing=()
for p in "${build_deps[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "openpbs: installing build dependencies ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

start=$SECONDS
work=$(mktemp -d "${TMPDIR:-/var/tmp}/openpbs-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM HUP
tar xzf "$tarball" -C "$work"
src=$work/openpbs-$COMMIT
log=$work/build.log
echo "openpbs: building $VERSION ($COMMIT) into $PREFIX (log $log while it runs)"
rm -rf "$PREFIX"
(
  cd "$src"
  ./autogen.sh
  # Debian's Python (python3-dev), whatever python3 comes first on PATH: the hooks' interpreter must not
  # depend on a user's pyenv or venv.
  ./configure --prefix="$PREFIX" --with-python=/usr
  make -j2
  # Its install would also write /etc/profile.d and the systemd unit folder: keep those under the prefix.
  make install sysprofiledir="$PREFIX/etc/profile.d" unitfiledir="$PREFIX/lib/systemd/system"
  # What the package's file list sets (openpbs.spec): a user's qsub authenticates through the setuid pbs_iff.
  chmod 4755 "$PREFIX/sbin/pbs_iff" "$PREFIX/sbin/pbs_rcp"
) > "$log" 2>&1 || {
  tail -n 40 "$log" >&2
  echo "openpbs: build failed (above: the end of its log); rerun $0 after fixing the cause" >&2
  rm -rf "$PREFIX"
  exit 1
}
took=$((SECONDS - start))
echo "OpenPBS $VERSION ($COMMIT) recipe $RECIPE, built in $took s on $(nproc) cores, $(date -u +%FT%TZ)" > "$MARKER"
echo "openpbs: built in $took s: $PREFIX"
