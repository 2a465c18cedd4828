# syntax=docker/dockerfile:1
# The webhook image. Build from the repository root: docker build -t topology-webhook:0.1.0 .
# Pin the base by digest for reproducible builds: --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# Builder: installs the project and its pinned dependencies into a venv without pip of its own.
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CONSTRAINT=/src/.ci/constraints.txt
WORKDIR /src
RUN python -m venv --without-pip /opt/venv
COPY .ci/constraints.txt .ci/constraints.txt
COPY setup.cfg pyproject.toml README.md LICENSE ./
COPY webhook webhook
# Only wheels for dependencies (no compiler is needed or present); `pip check` stops the build on
# a dependency that the constraints do not satisfy.
RUN pip --python /opt/venv/bin/python install --only-binary=:all: --no-binary=topology-webhook . \
 && pip --python /opt/venv/bin/python check

# Runtime: the same base (the venv's interpreter path must exist), the venv, a non-root user.
FROM ${PYTHON_IMAGE}
# What CI knows at build time: --build-arg VERSION=0.1.0 REVISION=$(git rev-parse HEAD) CREATED=<RFC 3339>
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="topology-webhook" \
      org.opencontainers.image.description="Kubernetes mutating admission webhook that places GPU workloads by network and NVLink topology" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
RUN python -m pip uninstall --yes --no-cache-dir pip setuptools wheel \
 && groupadd --system --gid 65532 webhook \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin webhook
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Numeric, so the kubelet can enforce runAsNonRoot.
USER 65532:65532
EXPOSE 8443 9090
# `serve` runs gunicorn over TLS with the certificate and key mounted from the Secret, and reloads
# them when kubelet swaps the files. No HEALTHCHECK: Kubernetes probes /healthz and /readyz.
ENTRYPOINT ["topology-webhook"]
CMD ["serve", "--config", "/etc/topology-webhook/config/config.yaml", "--cert", "/etc/topology-webhook/tls/tls.crt", "--key", "/etc/topology-webhook/tls/tls.key", "--bind", "0.0.0.0:8443", "--metrics-bind", "0.0.0.0:9090"]
