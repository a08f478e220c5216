#!/usr/bin/env bash
# The OS packages of the images, for the Dockerfile and singularity.def alike (Ubuntu 22.04; Debian 12
# for the offline local build, `make docker-local-base`).
#
# usage: containers/os-packages.sh build|runtime [--infiniband]
#   build         python3 + venv, and git for the pinned git dependencies (containers/install.sh)
#   runtime       python3 alone: the venv is copied in from the build stage
#   --infiniband  also the InfiniBand userland (rdma-core): NCCL dlopens libibverbs.so.1 and, through it, the
#                 mlx5 provider; without them it logs `NET/IB : No device found` and all-reduces over TCP
#                 sockets between nodes. The GPU images (cuda11 target, the .sif) pass it.
#
# Versions are not pinned here on purpose: the base image is pinned by digest, and Ubuntu's archive keeps
# only the newest build of a package in -updates/-security, so an `=version` pin breaks the build at the
# next security update. What matters for the stack (every Python package) comes from the hashed lock; the
# versions installed here are printed into the build log below.
set -euo pipefail

# octo_dist/stack/imagedefs.py checks this list (INFINIBAND_PACKAGES) and that the GPU images ask for it.
infiniband=(libibverbs1 ibverbs-providers librdmacm1)

case "${1:-}" in
  build) packages=(ca-certificates git python3 python3-venv) ;;
  runtime) packages=(ca-certificates python3) ;;
  *)
    echo "usage: $0 build|runtime [--infiniband]   (got '${1:-}')" >&2
    exit 2
    ;;
esac
case "${2:-}" in
  --infiniband) packages+=("${infiniband[@]}") ;;
  "") ;;
  *)
    echo "usage: $0 build|runtime [--infiniband]   (got '${2}')" >&2
    exit 2
    ;;
esac

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends "${packages[@]}"
rm -rf /var/lib/apt/lists/*
# For the build record, beside install.sh's `pip freeze`.
dpkg-query -W -f '${Package}=${Version}\n' "${packages[@]}"
