# octo-dist images, three targets from one recipe:
#   cpu     Ubuntu 22.04 + the cpu profile (jax 0.4.22, Open MPI 5 from PyPI): local smoke tests, CI
#   cuda11  nvidia/cuda 11.8 base + the cuda11 profile (jax 0.4.20, CUDA libraries from nvidia-*-cu11 wheels)
#   cuda12  Ubuntu 22.04 (the cpu base, no CUDA image) + the cuda12 profile (jax[cuda12] 0.4.23 from PyPI: jaxlib,
#           the CUDA 12 plugin, CUDA 12.2 / cuDNN 8.9 from nvidia-*-cu12 wheels; the driver comes from the host,
#           docker run --gpus / singularity --nv): ABCI 3.0's H200 nodes (docs/abci.md)
#
#   make docker PROFILE=cpu|cuda11|cuda12     (docker build --target <profile> .)
#   make docker-smoke                  (cpu image, 2-rank smoke job under the image's mpirun)
#
# Every pin comes from env/: the base image ARGs and VERSION below are written from env/stack.toml [images] and
# octo_dist.__version__ by `make image-defs` (edit env/, not them; tests and `make docker` fail a stale line),
# and containers/install.sh installs the profile's hashed lock. Behind a TLS-intercepting proxy pass its CA as a build secret, never a layer:
#   docker build --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt --target cpu .
# Credentials (WANDB_API_KEY) are never built in: pass them at run time (docker run -e WANDB_API_KEY).

# Base images: repository, tag (for people and the base.name label) and digest (what is pulled).
ARG CPU_BASE_REPO=docker.io/library/ubuntu
ARG CPU_BASE_TAG=22.04
ARG CPU_BASE_DIGEST=sha256:0eb0f877e1c869a300c442c41120e778db7161419244ee5cbc6fa5f134e74736
ARG CUDA11_BASE_REPO=docker.io/nvidia/cuda
ARG CUDA11_BASE_TAG=11.8.0-base-ubuntu22.04
ARG CUDA11_BASE_DIGEST=sha256:79e5b2cf878ee9006f5b3738caeea34fdc7708a32db53fe3e80db0b48bd286a0
# OCI labels. VERSION is octo_dist.__version__ (checked); `make docker` passes the git REVISION.
ARG SOURCE=https://github.com/octo-dist/octo-dist
ARG REVISION=unknown
ARG VERSION=0.1.0
# --require-git: an image without octo and dlimp at their pinned commits is not built. Only the offline
# local build (make docker-local-base, no GitHub) passes --skip-git.
ARG GIT_DEPS=--require-git

# ---- the two operating systems (same Ubuntu 22.04, python3 = 3.10) ---------------------------------
# No engine but Docker takes a tag and a digest in one reference, so FROM pulls by digest alone. cuda12 builds on
# os-cpu: every CUDA library it needs is a wheel in its lock.
FROM ${CPU_BASE_REPO}@${CPU_BASE_DIGEST} AS os-cpu
FROM ${CUDA11_BASE_REPO}@${CUDA11_BASE_DIGEST} AS os-cuda11

# ---- build: the one install script, into /opt/octo-dist/venv ---------------------------------------
FROM os-cpu AS build-cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY containers/os-packages.sh /tmp/os-packages.sh
RUN bash /tmp/os-packages.sh build
WORKDIR /opt/octo-dist
# Only what the install needs (see .dockerignore): the lock, the script, the package.
COPY pyproject.toml README.md ./
COPY env/ env/
COPY containers/ containers/
COPY octo_dist/ octo_dist/
COPY scripts/ scripts/
ARG GIT_DEPS
RUN --mount=type=secret,id=ca,required=false \
    OCTO_DIST_CA=/run/secrets/ca containers/install.sh cpu /opt/octo-dist/venv "${GIT_DEPS}"

FROM os-cuda11 AS build-cuda11
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY containers/os-packages.sh /tmp/os-packages.sh
RUN bash /tmp/os-packages.sh build
WORKDIR /opt/octo-dist
COPY pyproject.toml README.md ./
COPY env/ env/
COPY containers/ containers/
COPY octo_dist/ octo_dist/
COPY scripts/ scripts/
ARG GIT_DEPS
RUN --mount=type=secret,id=ca,required=false \
    OCTO_DIST_CA=/run/secrets/ca containers/install.sh cuda11 /opt/octo-dist/venv "${GIT_DEPS}"

FROM os-cpu AS build-cuda12
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY containers/os-packages.sh /tmp/os-packages.sh
RUN bash /tmp/os-packages.sh build
WORKDIR /opt/octo-dist
COPY pyproject.toml README.md ./
COPY env/ env/
COPY containers/ containers/
COPY octo_dist/ octo_dist/
COPY scripts/ scripts/
ARG GIT_DEPS
RUN --mount=type=secret,id=ca,required=false \
    OCTO_DIST_CA=/run/secrets/ca containers/install.sh cuda12 /opt/octo-dist/venv "${GIT_DEPS}"

# ---- runtime: python3, the venv, env/ (for check-env), a non-root user ------------------------------
FROM os-cpu AS cpu
COPY containers/os-packages.sh /tmp/os-packages.sh
RUN bash /tmp/os-packages.sh runtime && rm /tmp/os-packages.sh \
    && useradd --create-home --uid 1000 --shell /bin/bash octo
COPY --from=build-cpu /opt/octo-dist/venv /opt/octo-dist/venv
COPY env/ /opt/octo-dist/env/
# PYTHONNOUSERSITE: a mounted home's ~/.local never shadows the pinned stack.
ENV OCTO_DIST_PROFILE=cpu \
    OCTO_DIST_MANIFEST=/opt/octo-dist/env/stack.toml \
    PATH=/opt/octo-dist/venv/bin:$PATH \
    PYTHONNOUSERSITE=1 \
    PYTHONUNBUFFERED=1
USER octo
WORKDIR /home/octo
CMD ["octo-dist", "check-env"]
# Labels last: REVISION changes with every commit and would otherwise rebuild every layer after it.
ARG CPU_BASE_REPO
ARG CPU_BASE_TAG
ARG CPU_BASE_DIGEST
ARG SOURCE
ARG REVISION
ARG VERSION
LABEL org.opencontainers.image.title="octo-dist (cpu)" \
      org.opencontainers.image.description="Octo data-parallel fine-tuning, cpu profile: smoke tests and CI" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${CPU_BASE_REPO}:${CPU_BASE_TAG}" \
      org.opencontainers.image.base.digest="${CPU_BASE_DIGEST}" \
      io.github.octo-dist.profile="cpu"

FROM os-cuda11 AS cuda11
COPY containers/os-packages.sh /tmp/os-packages.sh
# --infiniband: rdma-core's libibverbs1, ibverbs-providers, librdmacm1, so NCCL uses the InfiniBand HCAs between
# nodes instead of TCP sockets.
RUN bash /tmp/os-packages.sh runtime --infiniband && rm /tmp/os-packages.sh \
    && useradd --create-home --uid 1000 --shell /bin/bash octo
COPY --from=build-cuda11 /opt/octo-dist/venv /opt/octo-dist/venv
# Stop the build if the verbs library NCCL opens does not load (it would fall back to TCP between nodes).
RUN /opt/octo-dist/venv/bin/python -c 'import sys; from octo_dist.envcheck import transport; sys.exit(transport.load_verbs())'
COPY env/ /opt/octo-dist/env/
# LD_LIBRARY_PATH is left as the base sets it: jaxlib finds cuDNN/cuBLAS in the nvidia-*-cu11 wheels itself.
ENV OCTO_DIST_PROFILE=cuda11 \
    OCTO_DIST_MANIFEST=/opt/octo-dist/env/stack.toml \
    PATH=/opt/octo-dist/venv/bin:$PATH \
    PYTHONNOUSERSITE=1 \
    PYTHONUNBUFFERED=1
USER octo
WORKDIR /home/octo
CMD ["octo-dist", "check-env"]
# Labels last: REVISION changes with every commit and would otherwise rebuild every layer after it.
ARG CUDA11_BASE_REPO
ARG CUDA11_BASE_TAG
ARG CUDA11_BASE_DIGEST
ARG SOURCE
ARG REVISION
ARG VERSION
LABEL org.opencontainers.image.title="octo-dist (cuda11)" \
      org.opencontainers.image.description="Octo data-parallel fine-tuning, cuda11 profile: CUDA 11.8 GPUs" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${CUDA11_BASE_REPO}:${CUDA11_BASE_TAG}" \
      org.opencontainers.image.base.digest="${CUDA11_BASE_DIGEST}" \
      io.github.octo-dist.profile="cuda11"

FROM os-cpu AS cuda12
COPY containers/os-packages.sh /tmp/os-packages.sh
# --infiniband: as cuda11, so NCCL uses the InfiniBand HCAs between nodes instead of TCP sockets.
RUN bash /tmp/os-packages.sh runtime --infiniband && rm /tmp/os-packages.sh \
    && useradd --create-home --uid 1000 --shell /bin/bash octo
COPY --from=build-cuda12 /opt/octo-dist/venv /opt/octo-dist/venv
RUN /opt/octo-dist/venv/bin/python -c 'import sys; from octo_dist.envcheck import transport; sys.exit(transport.load_verbs())'
COPY env/ /opt/octo-dist/env/
# No LD_LIBRARY_PATH: the CUDA plugin finds cuDNN/cuBLAS in the nvidia-*-cu12 wheels itself, and libcuda.so.1
# (the driver) is what --gpus / --nv bring in from the host.
ENV OCTO_DIST_PROFILE=cuda12 \
    OCTO_DIST_MANIFEST=/opt/octo-dist/env/stack.toml \
    PATH=/opt/octo-dist/venv/bin:$PATH \
    PYTHONNOUSERSITE=1 \
    PYTHONUNBUFFERED=1
USER octo
WORKDIR /home/octo
CMD ["octo-dist", "check-env"]
# Labels last: REVISION changes with every commit and would otherwise rebuild every layer after it.
ARG CPU_BASE_REPO
ARG CPU_BASE_TAG
ARG CPU_BASE_DIGEST
ARG SOURCE
ARG REVISION
ARG VERSION
LABEL org.opencontainers.image.title="octo-dist (cuda12)" \
      org.opencontainers.image.description="Octo data-parallel fine-tuning, cuda12 profile: CUDA 12 GPUs (H200)" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${CPU_BASE_REPO}:${CPU_BASE_TAG}" \
      org.opencontainers.image.base.digest="${CPU_BASE_DIGEST}" \
      io.github.octo-dist.profile="cuda12"
