# syntax=docker/dockerfile:1
# The flexmig image for Docker users. The image CI tests is built by deployments/image/build.sh
# (`make image`, no Docker needed); this file installs the same thing the same way: the Debian
# packages of deployments/image/packages.txt, then deployments/image/install.sh with wheels built
# under deployments/constraints.txt, and the same user, environment and entrypoint
# (tests/unit/test_image_build.py keeps the two in step). One image for every component:
#   flexmig controller ...      (Deployment, runs as the non-root user below)
#   flexmig kubeletplugin ...   (DaemonSet, runs as root and privileged: NVML's MIG calls need it)
#
# The base is Debian bookworm by tag, NOT by digest: no digest has been verified here. What makes the
# content checkable is apt, which verifies every package against the Debian archive keyring; the
# installed versions are recorded in /usr/lib/flexmig-image/packages.txt. To pin the base, pass
# `--build-arg BASE=debian:bookworm-slim@sha256:<digest you checked>`.
ARG BASE=docker.io/library/debian:bookworm-slim

# --- build: the package and its pinned dependencies as wheels ---------------------------------------
FROM ${BASE} AS build
RUN --mount=type=bind,source=deployments/image/packages.txt,target=/tmp/packages.txt \
    apt-get update \
    && apt-get install -y --no-install-recommends $(sed -e 's/#.*//' /tmp/packages.txt) \
    && rm -rf /var/lib/apt/lists/*
# PIP_CONSTRAINT also reaches pip's isolated build environment (setuptools, wheel).
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_CONSTRAINT=/src/deployments/constraints.txt
WORKDIR /src
# Only what the wheel contains (see pyproject.toml [tool.setuptools.packages.find]); tests,
# benchmarks and the chart stay out of the image (.dockerignore).
COPY deployments/constraints.txt ./deployments/constraints.txt
COPY pyproject.toml README.md ./
COPY api ./api
COPY driver ./driver
COPY controller ./controller
COPY kubeletplugin ./kubeletplugin
COPY flexmig ./flexmig
RUN python3 -m venv /venv \
    && /venv/bin/pip wheel --wheel-dir /wheels --only-binary=:all: --no-binary=flexmig .

# --- runtime ---------------------------------------------------------------------------------------
FROM ${BASE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
ARG SOURCE=https://github.com/flexmig/flexmig
# OCI image annotations (https://github.com/opencontainers/image-spec/blob/main/annotations.md);
# VERSION must equal pyproject's version and the chart's appVersion (the chart's default tag).
LABEL org.opencontainers.image.title="flexmig" \
      org.opencontainers.image.description="Kubernetes DRA driver gpu.flexmig.dev: NVIDIA MIG instances on demand (controller, webhook, kubelet plugin)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.url="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="debian:bookworm-slim"
RUN --mount=type=bind,source=deployments/image/packages.txt,target=/tmp/packages.txt \
    apt-get update \
    && apt-get install -y --no-install-recommends $(sed -e 's/#.*//' /tmp/packages.txt) \
    && rm -rf /var/lib/apt/lists/*
# Install from the wheels only (no index): exactly the versions resolved in the build stage, and no
# compiler or source tree in the final image. The bind mounts keep the wheels out of its layers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,source=deployments/image/install.sh,target=/tmp/install.sh \
    sh /tmp/install.sh /wheels \
    && mkdir -p /usr/lib/flexmig-image \
    && dpkg-query -W -f '${Package} ${Version} ${Architecture}\n' > /usr/lib/flexmig-image/packages.txt
ENV PATH=/opt/flexmig/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FLEXMIG_REVISION=${REVISION}
USER 65532:65532
ENTRYPOINT ["flexmig"]
CMD ["--help"]
