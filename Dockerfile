# syntax=docker/dockerfile:1
# runguard admission webhook. Build:  make image  (podman, no daemon, no registry: the
# base is made from Debian's packages and passed as PYTHON_IMAGE; scripts/build-image.sh)
# or, with a registry at hand:  docker build -t runguard:0.1.0 .
#
# tests/test_image.py builds it (make image), checks its entrypoint, user, stages and
# locked versions, and runs it as the Deployment's Pod runs.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: install runguard and its dependencies into a virtualenv --------------
FROM ${PYTHON_IMAGE} AS build
ENV VIRTUAL_ENV=/opt/runguard \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements-image.lock pyproject.toml README.md ./
COPY webhook ./webhook
# Dependencies: exactly the versions and hashes of requirements-image.lock (the tested
# versions, `make lock`), as published wheels (no compiler needed); then runguard with
# the locked setuptools. The venv gets no pip of its own: the image's pip installs into it.
RUN python -m venv --without-pip "$VIRTUAL_ENV" \
    && python -m pip --python "$VIRTUAL_ENV/bin/python" install --no-cache-dir \
        --require-hashes --no-deps --only-binary=:all: -r requirements-image.lock \
    && python -m pip --python "$VIRTUAL_ENV/bin/python" install --no-cache-dir \
        --no-deps --no-build-isolation . \
    && python -m pip --python "$VIRTUAL_ENV/bin/python" check

# --- runtime: the same slim base, the virtualenv, nothing else --------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="runguard" \
      org.opencontainers.image.description="Admission webhook policy engine for ML platform runs" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV VIRTUAL_ENV=/opt/runguard \
    PATH=/opt/runguard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    RUNGUARD_POLICY_DIR=/etc/runguard/policies \
    RUNGUARD_CERT_FILE=/etc/runguard/tls/tls.crt \
    RUNGUARD_KEY_FILE=/etc/runguard/tls/tls.key \
    RUNGUARD_BIND=0.0.0.0:8443 \
    RUNGUARD_WORKERS=2 \
    RUNGUARD_SHUTDOWN_DELAY=5 \
    RUNGUARD_CLIENT_CA=
# RUNGUARD_CLIENT_CA empty: no client certificate asked for. A CA file there requires
# the apiserver's certificate (mTLS, docs/dev/server.md); probes stay open.
# RUNGUARD_SHUTDOWN_DELAY: told to stop, keep answering 5 s (each connection closed
# after its answer) while load balancers and endpoints drop this replica.
COPY --from=build /opt/runguard /opt/runguard
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd.
USER 10001:10001
EXPOSE 8443
ENTRYPOINT ["runguard", "serve"]
