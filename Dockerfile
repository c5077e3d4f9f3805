# syntax=docker/dockerfile:1
#
# The valkey-operator image for those with a container engine (Docker/BuildKit, Podman, Buildah):
# the same image that `make image` (hack/image.sh) assembles here without one. The binary is built
# by the same script with the same flags (static, stripped, paths remapped), and the final stage
# holds only /valkey-operator, owned by root, run as 65532:65532 — no shell, no libc, no
# CA bundle, nothing else.
#
#   docker build -t ghcr.io/kuberly/valkey-operator:v0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t ghcr.io/kuberly/valkey-operator:v0.1.0 .
#
# Keep the labels, user, entrypoint and cmd in step with hack/image.sh (tests/packaging.rs checks
# that they agree, and that VERSION below is the workspace version).

ARG RUST_VERSION=1.95.0

FROM --platform=$BUILDPLATFORM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
ARG TARGETPLATFORM
WORKDIR /src
# The Rust target and, when cross-building, Debian's cross gcc for it (hack/dist.sh --setup);
# only the scripts and Cargo.toml (the version) are needed, so this layer outlives code changes.
COPY Cargo.toml ./
COPY hack/ hack/
RUN apt-get update \
 && hack/dist.sh --setup --platforms "$TARGETPLATFORM" \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    hack/image.sh binary "$TARGETPLATFORM" /out/valkey-operator

FROM scratch
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
COPY --from=build --chmod=0755 /out/valkey-operator /valkey-operator
USER 65532:65532
EXPOSE 8080/tcp
LABEL org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.description="Kubernetes operator for Valkey" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/kuberly/valkey-operator" \
      org.opencontainers.image.title="valkey-operator" \
      org.opencontainers.image.version="${VERSION}"
STOPSIGNAL SIGTERM
ENTRYPOINT ["/valkey-operator"]
CMD ["run"]
