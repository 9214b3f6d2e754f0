# syntax=docker/dockerfile:1
# The kvpolicy controller image: `kvpolicy run` as uid 10000, group `kvpolicy` (gid 10000).
#
#   docker build -f deploy/docker/controller.Dockerfile -t ghcr.io/kvpolicy/kvpolicy:0.2.0.dev0 .
#
# Build from the repository root (the build context); the first stage builds the wheel.
# deploy/kubernetes/kvpolicy.yaml runs this image; docs/deploy.md has the rest.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# ---- the wheel, built from this checkout ------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN python -m pip install --no-cache-dir build==1.6.1
COPY pyproject.toml README.md ./
COPY kvpolicy/ kvpolicy/
COPY adapters/ adapters/
COPY grammar/ grammar/
RUN python -m build --wheel --outdir /dist

# ---- the controller -----------------------------------------------------------------
FROM ${PYTHON_IMAGE}
# The ledger is shared through this group (--group kvpolicy, or its gid where the name
# is unknown, as in engine images): it must exist here.
RUN groupadd --system --gid 10000 kvpolicy \
 && useradd --system --uid 10000 --gid kvpolicy --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin kvpolicy
ARG WHEELHOUSE=/tmp/kvpolicy-dist
ENV KVPOLICY_VENV=/opt/kvpolicy
COPY --from=wheel /dist/ ${WHEELHOUSE}/
# `set --` picks the one wheel built above; [runtime] adds what the controller needs
# (watchdog, prometheus-client, nvidia-ml-py) to the policy tools.
RUN python -m venv "$KVPOLICY_VENV" \
 && set -- "$WHEELHOUSE"/kvpolicy-*.whl \
 && "$KVPOLICY_VENV/bin/pip" install --no-cache-dir "$1[runtime]" \
 && rm -rf "$WHEELHOUSE"
ENV PATH=${KVPOLICY_VENV}/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric, so that Kubernetes can check runAsNonRoot against it.
USER 10000:10000
# /metrics, /healthz, /readyz (serve them on every interface: --metrics-address 0.0.0.0:9464).
EXPOSE 9464
ENTRYPOINT ["kvpolicy", "run"]
CMD ["--help"]
