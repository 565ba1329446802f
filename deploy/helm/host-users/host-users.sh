#!/bin/sh
# Rendered manifests on stdin, the same with `hostUsers: false` on the Deployment named by the
# first argument (--post-renderer-args; default argocd-repo-server) on stdout, which also gets
# the annotation cmp-warden.io/post-renderer. kubectl's kustomize applies the patch; a chart
# without that Deployment is an error, not a no-op.
set -eu
name=${1:-argocd-repo-server}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/rendered.yaml"
if ! grep -q "^kind: Deployment" "$dir/rendered.yaml"; then
  echo "cmp-warden-host-users: no Deployment in the chart's output" >&2
  exit 1
fi
cat > "$dir/kustomization.yaml" <<KUST
resources: [rendered.yaml]
patches:
  - target: {kind: Deployment, name: $name}
    patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata:
        name: $name
        annotations:
          cmp-warden.io/post-renderer: cmp-warden-host-users
      spec:
        template:
          spec:
            hostUsers: false
KUST
kubectl kustomize "$dir" > "$dir/out.yaml"
# The annotation says the patch found its Deployment: without it the chart is not the one meant.
if ! grep -q "cmp-warden.io/post-renderer: cmp-warden-host-users" "$dir/out.yaml"; then
  echo "cmp-warden-host-users: no Deployment named $name in the chart's output" >&2
  exit 1
fi
cat "$dir/out.yaml"
