# fleetmq developer entry points. Everything is installed into .venv/ in the repo root.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CACHE ?= $(HOME)/.cache/fleetmq
LISTEN ?= 127.0.0.1:1883
# the node of the test control plane for `make envtest` / `make dev-cluster`: kwok (simulated) or real
NODE ?= kwok
IMAGE_ARCHIVES := $(CACHE)/images/archives
# the test control plane (tests/kubeapi.py): binaries built by `make envtest`, outside the repo
K8S_VERSION := $(shell awk '$$1 == "require" && $$2 == "k8s.io/kubernetes" {print $$3}' tests/envtest/go.mod)
export ENVTEST_BIN_DIR ?= $(CACHE)/envtest/$(K8S_VERSION)/bin

.PHONY: run test check lint typecheck contracts linktree bench deps venv clean envtest dev-cluster dev-cluster-down

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python

# Python packages the tests need (the pipeline's Spark tests too), plus the project in editable mode.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test,pipeline,operator]'
	touch $@

deps: $(VENV)/.installed
	bash scripts/system-deps.sh

# The CustomResourceDefinitions in crds/ and the chart's charts/fleetmq/crds/, generated from the pydantic
# models (tests fail when either is stale).
.PHONY: crds
crds: $(VENV)/.installed
	$(BIN)/python -m fleetmq.operator.crdgen

# The chart's Grafana dashboards (charts/fleetmq/dashboards/) and alert rules (charts/fleetmq/files/alerts.yaml),
# generated from operator/grafana.py (a test fails when stale).
.PHONY: dashboards
dashboards: $(VENV)/.installed
	$(BIN)/python -m fleetmq.operator.grafana

# The docs site (mkdocs.yml, docs/) built with --strict into site/ (git-ignored): a broken link, a page
# missing from the nav or a stale reference page fails. The reference pages (docs/reference/) are generated
# from the code by scripts/docsgen.py (`make docs-reference`; a unit test fails when they are stale).
SITE ?= site
.PHONY: docs docs-reference
$(VENV)/.docs-installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[docs]'
	touch $@

docs-reference: $(VENV)/.docs-installed
	$(BIN)/python -m scripts.docsgen

docs: $(VENV)/.docs-installed
	$(BIN)/python -m scripts.docsgen --check
	$(BIN)/mkdocs build --strict --site-dir $(SITE)

run: $(VENV)/.installed
	$(BIN)/fleetmq-broker --listen $(LISTEN)

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy (strict) on broker/ and chaos/. It finds fleetmq.broker through a link tree in the venv, since
# setuptools' editable install is an import hook that static checkers cannot follow.
typecheck: linktree
	$(BIN)/mypy -p fleetmq.broker -p fleetmq.operator -p chaos

# The import contracts of pyproject.toml's [tool.importlinter]: the broker's layers, and what the operator
# and the pipeline may import of it. Read through the same link tree.
contracts: linktree
	PYTHONPATH=$(VENV)/typecheck $(BIN)/lint-imports --no-cache

linktree: $(VENV)/.installed
	@mkdir -p $(VENV)/typecheck/fleetmq && for p in broker operator pipeline; do \
		ln -sfn ../../../$$p $(VENV)/typecheck/fleetmq/$$p; done

# The fast inner loop: lint, types, the layering contract and the unit tests; no apt, no Go, no servers.
check: lint typecheck contracts
	$(BIN)/pytest -q -p no:cacheprovider -m "not redis" tests/unit

# kube-apiserver, kube-controller-manager, kube-scheduler (k8s.io/kubernetes) and kwok built with Go into
# $(ENVTEST_BIN_DIR); reused when there, built when missing (the first build takes a while).
# NODE=real: also the real node's kubelet, kube-proxy, pause program and kubectl (for the chart's kubectl
# image), CoreDNS, and its Debian packages (containerd, runc, CNI plugins, nftables).
envtest: deps
	CACHE=$(CACHE) bash scripts/envtest.sh
ifeq ($(NODE),real)
	CACHE=$(CACHE) ENVTEST_COMPONENTS="kubelet kube-proxy pause kubectl" bash scripts/envtest.sh
	CACHE=$(CACHE) bash scripts/tools.sh coredns
	bash scripts/system-deps.sh node
endif

# helm, built with Go into $(CACHE)/tools (scripts/tools.sh; pinned there), for the chart tests.
.PHONY: tools e2e
tools:
	CACHE=$(CACHE) bash scripts/tools.sh helm

# The images the chart deploys, from the Dockerfile: fleetmq/broker:<version> and fleetmq/pipeline:<version>
# (scripts/image.sh: the machine's Docker engine, else a private Debian dockerd started and stopped for the
# build; the base image pulled, else a local stand-in cached in $(CACHE)/images). IMAGE_TARGETS=broker: one.
.PHONY: image
image: $(VENV)/.installed
	CACHE=$(CACHE) bash scripts/image.sh $(IMAGE_TARGETS)

# The user flow end to end (e2e/run.sh): the images built, then the README's Helm section and what a user
# relies on, on a real node of the test control plane (needs root; E2E_CLUSTER=kind: on kind, with a Docker
# engine). Says exactly what is missing and fails otherwise. Not part of `make test`; .ci/run runs both.
e2e: deps
	CACHE=$(CACHE) bash e2e/run.sh $(E2E_ARGS)

# A control plane for trying things by hand (kubectl, the operator, the chart); state in $(CACHE)/dev-cluster.
# NODE=real: with a real node (tests/realnode.py) whose containerd has the project's images (make image) and
# the chart's third-party images (pulled, or local stand-ins where no registry answers).
dev-cluster: envtest
ifeq ($(NODE),real)
	IMAGE_SAVE=$(IMAGE_ARCHIVES) CACHE=$(CACHE) bash scripts/image.sh broker pipeline standins >/dev/null
	$(BIN)/python -m tests.kubeapi up --dir $(CACHE)/dev-cluster --node real --images $(IMAGE_ARCHIVES)
else
	$(BIN)/python -m tests.kubeapi up --dir $(CACHE)/dev-cluster
endif

dev-cluster-down: $(VENV)/.installed
	$(BIN)/python -m tests.kubeapi down --dir $(CACHE)/dev-cluster

test: deps envtest tools typecheck contracts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: deps
	$(BIN)/python -m bench $(BENCH_ARGS)

# The fleet under faults (chaos/, README "Faults: make chaos"): 3 nodes, MQTT 3.1.1 and 5 clients at QoS 1
# and 2, a seeded nemesis, then a checker; exit 1 on any violation. One run per store form in
# CHAOS_STORES: one redis-server (AOF, appendfsync always) behind proxies, a primary with 2 replicas and 3
# sentinels, a Redis Cluster of 3 shards (each with the faults that apply to it). The default takes about
# ten minutes; a long campaign is e.g.
#   make chaos CHAOS_STORES=redis CHAOS_ARGS="--seed 101 --runs 7 --duration 600"
CHAOS_STORES ?= redis sentinel cluster
CHAOS_ARGS ?= --seed 1 --duration 180
.PHONY: chaos
chaos: deps
	@set -e; for store in $(CHAOS_STORES); do $(BIN)/python -m chaos --store $$store $(CHAOS_ARGS); done

clean:
	rm -rf $(VENV) build *.egg-info
