# runguard: the two commands are `make run` (set up, then serve the webhook over TLS on
# https://127.0.0.1:8443 with policies/ and fresh dev certificates) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_CERTS := certs/dev
BIND ?= 127.0.0.1:8443
POLICY ?= policies

.PHONY: all venv lock run certs test lint typecheck cases bench image cluster cluster-down e2e-release manifests clean

all: test

# Every Python package, direct and transitive, at the version and hashes requirements.lock
# names (pip, setuptools and the test tools included); then runguard itself, built with
# the locked setuptools. The image installs requirements-image.lock, the same versions.
$(STAMP): requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps --only-binary=:all: \
	    -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -m pip check
	touch $(STAMP)

venv: $(STAMP)

# Regenerates both locks from pyproject.toml, keeping every pin that still satisfies it;
# `make lock UPGRADE=1` moves every package to the newest version allowed, and
# `make lock UPGRADE=pyyaml` one package (docs/dev/contributing.md). The image's lock is
# the runtime subset, constrained to the test lock's versions.
LOCK_FLAGS := --quiet --generate-hashes --allow-unsafe --strip-extras --all-build-deps \
    --no-emit-index-url --no-emit-find-links --no-emit-trusted-host \
    $(if $(filter 1,$(UPGRADE)),--upgrade,$(if $(UPGRADE),--upgrade-package $(UPGRADE)))
lock: $(STAMP)
	CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile $(LOCK_FLAGS) \
	    --extra test --extra lock -o requirements.lock pyproject.toml
	CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile $(LOCK_FLAGS) \
	    -c requirements.lock -o requirements-image.lock pyproject.toml

$(DEV_CERTS)/tls.crt: | $(STAMP)
	$(BIN)/runguard certs --service runguard --namespace runguard --out $(DEV_CERTS) \
	    --host localhost --host 127.0.0.1

certs: $(DEV_CERTS)/tls.crt

run: $(STAMP) $(DEV_CERTS)/tls.crt
	$(BIN)/runguard lint -p $(POLICY)
	$(BIN)/runguard serve -p $(POLICY) --cert $(DEV_CERTS)/tls.crt --key $(DEV_CERTS)/tls.key \
	    --bind $(BIND)

# Everything CI runs: lint, types, unit + HTTP + e2e tests on Kubernetes 1.33 (go.mod),
# then the whole e2e suite on each release of E2E_FULL and its smoke subset on each of
# E2E_SMOKE (every build cached; docs/dev/e2e.md, "Kubernetes releases"; Kueue, which
# test_kueue.py runs, once for all: "A real Kueue"). RUNGUARD_E2E=0 skips every e2e build
# and test.
E2E_FULL := 1.37
E2E_SMOKE := 1.30
test: $(STAMP)
	$(BIN)/ruff check webhook tests bench
	$(BIN)/ruff format --check webhook tests bench
	$(BIN)/mypy
	if [ "$${RUNGUARD_E2E:-1}" != 0 ]; then \
	    bash tests/e2e/build.sh >/dev/null || exit 1; \
	    bash tests/e2e/build-kueue.sh >/dev/null || exit 1; \
	    bash tests/e2e/fetch-openreports.sh >/dev/null || exit 1; \
	    for k in $(E2E_FULL) $(E2E_SMOKE); do \
	        RUNGUARD_E2E_KUBERNETES=$$k bash tests/e2e/build.sh >/dev/null || exit 1; \
	    done; \
	fi
	$(BIN)/pytest -p no:cacheprovider
	if [ "$${RUNGUARD_E2E:-1}" != 0 ]; then \
	    for k in $(E2E_FULL); do $(MAKE) --no-print-directory e2e-release K8S=$$k || exit 1; done; \
	    for k in $(E2E_SMOKE); do \
	        $(MAKE) --no-print-directory e2e-release K8S=$$k SMOKE=1 || exit 1; \
	    done; \
	fi

lint: $(STAMP)
	$(BIN)/runguard lint -p $(POLICY)

cases: $(STAMP)
	$(BIN)/runguard test tests/cases

# The engine and the server under several worker models, OPA on the same rules, and Pod
# create latency through the e2e apiserver, interleaved rounds (~10 min); the last line
# is one JSON object (docs/dev/performance.md).
bench: $(STAMP)
	$(BIN)/python bench/bench_all.py

# The image, from the Dockerfile, with Debian's podman on a base made by mmdebstrap (no
# Docker daemon, no registry; the tools are apt-get installed when missing, the base is
# cached in ~/.cache/runguard/image): localhost/runguard:<version> (docs/operations.md).
image:
	@bash scripts/build-image.sh

# A local cluster (built once, cached): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok's simulated CPU/GPU/spot nodes and two real nodes (kubelet,
# containerd, the image `make image` builds; tainted runguard.io/real-node, so only what
# tolerates it runs there), all inside a network namespace with no route out, with
# runguard serving $(POLICY) in place and registered; INSTALL=1 installs runguard from
# manifests/ on the real nodes instead (webhooks by Service reference);
# REAL_NODE=0: no namespace, no real node, no root needed; POLICY_OBJECTS=1: RunPolicy
# and Profile as objects (the policy-objects component: kubectl get profiles, live
# edits). Prints the `export KUBECONFIG=...` line (docs/dev/e2e.md).
REAL_NODE ?= 1
cluster: $(STAMP)
	@$(BIN)/python tests/e2e/devcluster.py up --dir .cache/cluster --policy $(POLICY) \
	    $(if $(filter 1,$(INSTALL)),--install,$(if $(filter 1,$(REAL_NODE)),--real-node)) \
	    $(if $(filter 1,$(POLICY_OBJECTS)),--policy-objects)

cluster-down:
	@$(BIN)/python tests/e2e/devcluster.py down --dir .cache/cluster

# The e2e suite against another Kubernetes release than go.mod's 1.33: its pins are
# tests/e2e/go.kubernetes-$(K8S).mod/.sum, built and cached like 1.33's (with its own
# kubectl). `make e2e-release K8S=1.37`, or SMOKE=1 for the smoke subset: the install on
# the real nodes, and the modules whose expectations differ between releases
# (docs/dev/e2e.md). `make test` runs both.
K8S ?= 1.37
SMOKE_TESTS := tests/e2e/test_cluster.py tests/e2e/test_install.py tests/e2e/test_pods.py \
    tests/e2e/test_real_node.py tests/e2e/test_escapes.py tests/e2e/test_pod_security.py \
    tests/e2e/test_cluster_state.py
e2e-release: $(STAMP)
	RUNGUARD_E2E_KUBERNETES=$(K8S) bash tests/e2e/build.sh >/dev/null
	RUNGUARD_E2E_KUBERNETES=$(K8S) $(BIN)/pytest -p no:cacheprovider -m e2e \
	    $(if $(filter 1,$(SMOKE)),$(SMOKE_TESTS),tests/e2e)

clean:
	rm -rf $(VENV) $(DEV_CERTS) build *.egg-info
