# valkey-operator — the usual targets. Everything runs on the local control plane (hack/cluster).
SHELL := /bin/bash
CLUSTER := hack/cluster
CARGO ?= cargo

.PHONY: all build test lint fmt manifests install uninstall deploy undeploy cluster-up cluster-down demo demo-down image dist

all: build

build:
	$(CARGO) build --release --workspace

## test: the whole suite (unit, API server, end to end) on the local control plane, brought up
## for the run and down afterwards even when a test fails.
test:
	$(CLUSTER) up
	$(CARGO) test --workspace --all-targets; rc=$$?; $(CLUSTER) down; exit $$rc

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## manifests: regenerate manifests/crd.yaml from the Rust types.
manifests:
	$(CARGO) run -q -p valkey-operator -- crd > manifests/crd.yaml

## demo: the product on the local control plane (see hack/demo); demo-down stops it all.
demo:
	hack/demo

demo-down:
	hack/demo down

cluster-up:
	$(CLUSTER) up

cluster-down:
	$(CLUSTER) down

## install / uninstall: only the CRD, on the cluster of the current kubeconfig.
install:
	kubectl apply --server-side -f manifests/crd.yaml

uninstall:
	kubectl delete --ignore-not-found -f manifests/crd.yaml

## deploy / undeploy: the CRD, RBAC and the operator Deployment.
deploy:
	kubectl apply --server-side -k manifests/

undeploy:
	kubectl delete --ignore-not-found -k manifests/
