# syntax=docker/dockerfile:1
# One image for every flexmig component; the pod spec picks the subcommand:
#   flexmig controller ...      (Deployment, runs as the non-root user below)
#   flexmig kubeletplugin ...   (DaemonSet, runs as root and privileged: NVML's MIG calls need it)
# Build and push: see deployments/README.md, "Image".
# The only network access during the build is PyPI, and every package it installs is pinned by
# deployments/constraints.txt (build backend included), so two builds install the same set.

# The base is pinned by digest: python:3.11.10-slim-bookworm for linux/amd64 and arm64 (the digest of
# the multi-arch index). UNVERIFIED here: it was taken from a public Renovate-maintained Dockerfile,
# not pulled. Check it with `docker buildx imagetools inspect python:3.11.10-slim-bookworm` and
# update tag and digest together.
ARG PYTHON_IMAGE=docker.io/library/python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16

# --- build: turn the package and its pinned dependencies into wheels -------------------------------
FROM ${PYTHON_IMAGE} AS build
# PIP_CONSTRAINT also reaches pip's isolated build environment (setuptools, wheel).
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_CONSTRAINT=/src/constraints.txt
WORKDIR /src
COPY deployments/constraints.txt ./constraints.txt
# Only what the wheel contains (see pyproject.toml [tool.setuptools.packages.find]); tests,
# benchmarks and the chart stay out of the image (.dockerignore).
COPY pyproject.toml README.md ./
COPY api ./api
COPY driver ./driver
COPY controller ./controller
COPY kubeletplugin ./kubeletplugin
COPY flexmig ./flexmig
RUN pip wheel --wheel-dir /wheels .

# --- runtime ---------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
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
      org.opencontainers.image.base.name="docker.io/library/python:3.11.10-slim-bookworm"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Install from the wheels only (no index): exactly the versions resolved in the build stage, and no
# compiler or source tree in the final image. The bind mount keeps the wheels out of its layers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels flexmig \
    && flexmig --version
# A fixed numeric non-root user, so `runAsNonRoot: true` can verify it without a passwd lookup.
RUN groupadd --system --gid 65532 flexmig \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin flexmig
USER 65532:65532
ENTRYPOINT ["flexmig"]
CMD ["--help"]
