#!/usr/bin/env bash
# Builds a Go program the local cluster runs beside the control plane, once per pinned version, and
# prints its path:
#   kwok   sigs.k8s.io/kwok v0.8.0: kubelets that only write status (Ready nodes, node Leases, pods
#          that go Running and finish);
#   kueue  sigs.k8s.io/kueue v0.17.0: the queue, its Topology-aware scheduling included.
# Each has its own go.mod (other Kubernetes library versions than hack/kube's), so each is installed
# as published. The binary and what the local cluster applies from the module (KWOK's stages, Kueue's
# CRDs and webhook configurations) are cached in hack/.tools/NAME-VERSION/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"  # where the Go tarball installs
case "${1:-}" in
    kwok) MODULE=sigs.k8s.io/kwok VERSION=v0.8.0 FILES="kustomize/stage" ;;
    kueue) MODULE=sigs.k8s.io/kueue VERSION=v0.17.0
           FILES="config/components/crd/bases config/components/webhook" ;;
    *) echo "usage: hack/go-install.sh kwok|kueue" >&2; exit 2 ;;
esac
OUT=$PWD/.tools/$1-$VERSION
if [ ! -x "$OUT/$1" ]; then
    GOBIN="$OUT" go install "$MODULE/cmd/$1@$VERSION" >&2
fi
if [ ! -d "$OUT/module" ]; then
    SOURCE=$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    rm -rf "$OUT/module.tmp"
    for FILE in $FILES; do
        mkdir -p "$OUT/module.tmp/$(dirname "$FILE")"
        cp -r --no-preserve=mode "$SOURCE/$FILE" "$OUT/module.tmp/$FILE"  # the module cache is read-only
    done
    mv "$OUT/module.tmp" "$OUT/module"
fi
echo "$OUT/$1"
