# lakehouse-ingest — set-up, run and test. `make run` and `make test` do all set-up.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON      ?= python3.11
VENV        ?= .venv
PY          := $(VENV)/bin/python
# Downloaded artefacts (jars, MinIO binary) live outside git and outside the clone,
# so every clone on a machine shares one warm cache.
LAKEHOUSE_CACHE ?= $(HOME)/.cache/lakehouse-ingest
export LAKEHOUSE_CACHE
SPARK_JARS  := $(LAKEHOUSE_CACHE)/jars/spark
KAFKA_JARS  := $(LAKEHOUSE_CACHE)/jars/kafka
MINIO_BIN   := $(LAKEHOUSE_CACHE)/bin/minio
# Pinned MinIO source revision, built with `go install` (no binary downloads).
MINIO_MODULE := github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c

SPARK_POM_HASH := $(shell sha256sum deploy/jvm/spark/pom.xml | cut -c1-16)
# The service's Java (jvm/checker: the typed fast path's checker, the local file system),
# built into the Spark jars directory.
CHECKER_HASH   := $(shell cat jvm/checker/pom.xml $$(find jvm/checker/src -type f | sort) | sha256sum | cut -c1-16)
SPARK_JARS_STAMP := $(SPARK_JARS)/.stamp-$(SPARK_POM_HASH)-$(CHECKER_HASH)
KAFKA_POM_HASH := $(shell sha256sum deploy/jvm/kafka/pom.xml 2>/dev/null | cut -c1-16)
MINIO_HASH     := $(shell echo $(MINIO_MODULE) | sha256sum | cut -c1-16)
# Pinned helm, built with `go install` (no binary downloads); used by tests/deploy.
HELM_VERSION := v3.21.4
# promtool of the Prometheus that compose and the chart's docs pin (3.5.0: its Go module
# is tagged v0.305.0), besides Debian's 2.x: the alert rules' unit tests run on both.
# Built in a throw-away module (the prometheus module's replace directives refuse
# `go install pkg@version`).
PROMETHEUS_MODULE_VERSION := v0.305.0
# Pinned Alertmanager and amtool (the version compose runs), built with `go install`;
# tests/deploy check the shipped Alertmanager configuration with them.
ALERTMANAGER_VERSION := v0.28.1
# What helm's own release build stamps in (version, and the Kubernetes version of its
# k8s.io modules, the default of `helm template`); tests pass --kube-version anyway.
HELM_LDFLAGS := -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
  -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=36 \
  -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=36

.PHONY: help setup venv jars kafka-jars minio cds tools prometheus run test test-unit test-integration lint typecheck bench image image-tools image-test clean

help:
	@echo "make run    set up everything, start local Kafka + generator + the service (Ctrl-C stops all)"
	@echo "make test   set up everything and run the whole test suite"
	@echo "make bench  benchmark on this machine: baseline vs ingest vs ingest+gold (not a test;"
	@echo "            BENCH_ARGS='--help' lists the options, e.g. BENCH_ARGS='--mode sustained')"
	@echo "make image       build the image from the Dockerfile with buildah (no Docker engine)"
	@echo "make image-test  build it, then run the service inside it against local Kafka and MinIO"
	@echo "make lint | typecheck | test-unit | test-integration | clean"

setup: venv jars kafka-jars minio tools prometheus cds

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml requirements.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c requirements.lock -e '.[dev]'
	touch $@

jars: $(SPARK_JARS_STAMP)
$(SPARK_JARS_STAMP):
	rm -rf $(SPARK_JARS) && mkdir -p $(SPARK_JARS)
	cd deploy/jvm/spark && mvn -B -q -s ../settings.xml dependency:copy-dependencies \
	  -DexcludeTransitive=true -DoutputDirectory=$(SPARK_JARS)
	mvn -B -q -s deploy/jvm/settings.xml -f jvm/checker/pom.xml -Dmaven.test.skip=true package
	cp jvm/checker/target/lakehouse-ingest-checker-1.jar $(SPARK_JARS)/
	touch $@

# The driver JVM's class-data-sharing archive (deploy/local/cds.py): made by one driver
# run on a local Kafka and MinIO, valid for these jars, this virtualenv's PySpark and
# this JDK; the venv's drivers find it there (INGEST_SPARK_CDS_ARCHIVE) and start with
# about a third less CPU. It extends the JDK's own archive (lib/server/classes.jsa), so
# a JDK whose archive was regenerated in place (same version) needs a new one too.
JAVA_HASH := $(shell (java -version 2>&1; cat "$$(dirname "$$(readlink -f "$$(command -v java)")")/../lib/server/classes.jsa" 2>/dev/null) | sha256sum | cut -c1-16)
cds: $(VENV)/.stamp-cds-$(JAVA_HASH)-$(SPARK_POM_HASH)-$(CHECKER_HASH)
$(VENV)/.stamp-cds-$(JAVA_HASH)-$(SPARK_POM_HASH)-$(CHECKER_HASH): $(VENV)/.installed $(SPARK_JARS_STAMP) $(KAFKA_JARS)/.stamp-$(KAFKA_POM_HASH) $(LAKEHOUSE_CACHE)/bin/.stamp-minio-$(MINIO_HASH)
	rm -f $(VENV)/.stamp-cds-*
	$(PY) deploy/local/cds.py $(VENV)/share/lakehouse-ingest/driver-classes.jsa
	touch $@

kafka-jars: $(KAFKA_JARS)/.stamp-$(KAFKA_POM_HASH)
$(KAFKA_JARS)/.stamp-$(KAFKA_POM_HASH):
	rm -rf $(KAFKA_JARS) && mkdir -p $(KAFKA_JARS)
	cd deploy/jvm/kafka && mvn -B -q -s ../settings.xml dependency:copy-dependencies \
	  -DincludeScope=runtime -DoutputDirectory=$(KAFKA_JARS)
	touch $@

minio: $(LAKEHOUSE_CACHE)/bin/.stamp-minio-$(MINIO_HASH)
$(LAKEHOUSE_CACHE)/bin/.stamp-minio-$(MINIO_HASH):
	mkdir -p $(LAKEHOUSE_CACHE)/bin
	GOBIN=$(LAKEHOUSE_CACHE)/bin GOFLAGS=-mod=mod go install $(MINIO_MODULE)
	touch $@

# hadolint, the Compose-spec and Kubernetes schemas come with the venv (pyproject dev extras).
tools: $(LAKEHOUSE_CACHE)/bin/.stamp-helm-$(HELM_VERSION) $(LAKEHOUSE_CACHE)/bin/.stamp-alertmanager-$(ALERTMANAGER_VERSION) \
  $(LAKEHOUSE_CACHE)/bin/.stamp-promtool-$(PROMETHEUS_MODULE_VERSION)
$(LAKEHOUSE_CACHE)/bin/.stamp-promtool-$(PROMETHEUS_MODULE_VERSION):
	mkdir -p $(LAKEHOUSE_CACHE)/bin
	build=$$(mktemp -d) && cd $$build && go mod init promtool-build && \
	  GOFLAGS=-mod=mod go get github.com/prometheus/prometheus/cmd/promtool@$(PROMETHEUS_MODULE_VERSION) && \
	  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -o $(LAKEHOUSE_CACHE)/bin/promtool-3 \
	    github.com/prometheus/prometheus/cmd/promtool && rm -rf $$build
	touch $@
$(LAKEHOUSE_CACHE)/bin/.stamp-alertmanager-$(ALERTMANAGER_VERSION):
	mkdir -p $(LAKEHOUSE_CACHE)/bin
	GOBIN=$(LAKEHOUSE_CACHE)/bin CGO_ENABLED=0 GOFLAGS=-mod=mod go install \
	  github.com/prometheus/alertmanager/cmd/alertmanager@$(ALERTMANAGER_VERSION) \
	  github.com/prometheus/alertmanager/cmd/amtool@$(ALERTMANAGER_VERSION)
	touch $@
$(LAKEHOUSE_CACHE)/bin/.stamp-helm-$(HELM_VERSION):
	mkdir -p $(LAKEHOUSE_CACHE)/bin
	GOBIN=$(LAKEHOUSE_CACHE)/bin CGO_ENABLED=0 GOFLAGS=-mod=mod go install -ldflags "$(HELM_LDFLAGS)" \
	  helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	touch $@

# Prometheus + promtool from Debian, when missing (needs root). Tests start their own
# server on a free loopback port with temporary storage, so the package's own service
# (if the init system starts one) is never used.
prometheus:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
	  apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus; }

run: setup
	$(PY) deploy/local/run_local.py

test: setup
	$(VENV)/bin/ruff check service tests deploy/local deploy/bench
	$(VENV)/bin/ruff format --check service tests deploy/local deploy/bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(VENV)/bin/pytest -n 3 tests --ignore=tests/image

test-unit: setup
	$(VENV)/bin/pytest tests/unit

test-integration: setup
	$(VENV)/bin/pytest tests/integration

lint: venv
	$(VENV)/bin/ruff check service tests deploy/local deploy/bench
	$(VENV)/bin/ruff format --check service tests deploy/local deploy/bench
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy

# Throughput, latency and resources (deploy/bench/README.md); never part of `make test`.
bench: setup
	$(PY) deploy/bench/bench.py $(BENCH_ARGS)

# The image, built without a Docker engine or a registry (deploy/image/build.sh): bases
# from Debian's packages by mmdebstrap, the Dockerfile's steps by buildah (both from
# Debian, installed when missing; needs root).
IMAGE ?= localhost/lakehouse-ingest:dev
image-tools:
	@command -v buildah >/dev/null && command -v mmdebstrap >/dev/null || { \
	  apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah mmdebstrap; }

image: image-tools
	deploy/image/build.sh $(IMAGE)

image-test: setup image
	LAKEHOUSE_IMAGE=$(IMAGE) $(VENV)/bin/pytest tests/image

clean:
	rm -rf var build *.egg-info .pytest_cache .mypy_cache .ruff_cache
