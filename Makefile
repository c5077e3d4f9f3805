# valkey-operator — the usual targets. Everything runs on the local control plane (hack/cluster).
SHELL := /bin/bash
CLUSTER := hack/cluster
CARGO ?= cargo

.PHONY: all build test chaos lint fmt manifests install uninstall deploy undeploy cluster-up cluster-down demo demo-down image dist

all: build

build:
	$(CARGO) build --release --workspace

## test: the whole suite (unit, API server, end to end) on the local control plane, brought up
## for the run and down afterwards even when a test fails.
test:
	$(CLUSTER) up
	$(CARGO) test --workspace --all-targets; rc=$$?; $(CLUSTER) down; exit $$rc

## chaos: the failover scenarios once each, on the real nodes of the local control plane (see
## README, "The chaos suite"); the cluster stays up. bench/failover.sh repeats them and prints figures.
chaos:
	$(CLUSTER) up
	$(CARGO) build -p kubectl-valkey
	$(CARGO) test -p valkey-operator --test chaos -- --ignored --test-threads 1

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## manifests: regenerate manifests/crd.yaml and the chart's copy from the Rust types.
manifests:
	$(CARGO) run -q -p valkey-operator -- crd > manifests/crd.yaml
	cp manifests/crd.yaml charts/valkey-operator/crds/valkeys.database.kuberly.io.yaml

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

## image: the operator's FROM-scratch OCI image, built without a container engine (hack/image.sh):
## dist/valkey-operator-vX.Y.Z.oci.tar (and the layout in dist/image/), tagged with the reference
## manifests/deployment.yaml uses. IMAGE_PLATFORMS=linux/amd64,linux/arm64 for a multi-platform index.
image:
	CARGO=$(CARGO) hack/image.sh $(if $(IMAGE_PLATFORMS),--platform $(IMAGE_PLATFORMS))

## dist: kubectl-valkey release archives (binary + LICENSE) for every platform this machine can
## build, dist/SHA256SUMS and krew/valkey.yaml (hack/dist.sh; `hack/dist.sh --setup` installs the
## cross toolchains). DIST_PLATFORMS=linux/amd64,... for a subset.
dist:
	CARGO=$(CARGO) hack/dist.sh $(if $(DIST_PLATFORMS),--platforms $(DIST_PLATFORMS))
