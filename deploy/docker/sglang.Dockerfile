# syntax=docker/dockerfile:1
# SGLang's own image with the kvpolicy plugin added (an sglang.srt.plugins entry point,
# idle until KVPOLICY_ENABLE=1). The adapter is validated against SGLang 0.5.23 only.
#
#   docker build -f deploy/docker/sglang.Dockerfile -t ghcr.io/kvpolicy/sglang:v0.5.23-kvpolicy0.2.0.dev0 .
#
# Build from the repository root. The environment the plugin reads is set per
# deployment, not here: see docs/deploy.md ("Engine images").
ARG PYTHON_IMAGE=python:3.12-slim-bookworm
ARG ENGINE_IMAGE=lmsysorg/sglang:v0.5.23

# ---- the wheel, built from this checkout ------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN python -m pip install --no-cache-dir build==1.6.1
COPY pyproject.toml README.md ./
COPY kvpolicy/ kvpolicy/
COPY adapters/ adapters/
COPY grammar/ grammar/
RUN python -m build --wheel --outdir /dist

# ---- the engine ---------------------------------------------------------------------
FROM ${ENGINE_IMAGE}
ARG WHEELHOUSE=/tmp/kvpolicy-dist
COPY --from=wheel /dist/ ${WHEELHOUSE}/
# Beside the engine, changing none of its packages: pip is held to the versions the
# image has (a conflict fails the build instead of replacing one of SGLang's).
RUN python3 -m pip list --format=freeze > /tmp/engine-packages.txt \
 && set -- "$WHEELHOUSE"/kvpolicy-*.whl \
 && python3 -m pip install --no-cache-dir --constraint /tmp/engine-packages.txt "$1[engine]" \
 && rm -rf "$WHEELHOUSE" /tmp/engine-packages.txt
