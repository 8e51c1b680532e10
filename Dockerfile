# syntax=docker/dockerfile:1
# One image for every flexmig component; the pod spec picks the subcommand:
#   flexmig controller ...      (Deployment, runs as the non-root user below)
#   flexmig kubeletplugin ...   (DaemonSet, runs as root and privileged: NVML's MIG calls need it)
# Build: docker build -t ghcr.io/flexmig/flexmig:0.1.0 .
# The only network access during the build is PyPI (build backend and pinned dependencies).

ARG PYTHON_IMAGE=python:3.11-slim

# --- build: turn the package and its pinned dependencies into wheels -------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
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
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Install from the wheels only (no index): exactly the versions resolved in the build stage, and no
# compiler or source tree in the final image. The bind mount keeps the wheels out of its layers.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels flexmig \
    && flexmig --help >/dev/null
# A fixed numeric non-root user, so `runAsNonRoot: true` can verify it without a passwd lookup.
RUN groupadd --system --gid 65532 flexmig \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin flexmig
USER 65532:65532
ENTRYPOINT ["flexmig"]
CMD ["--help"]
