#!/usr/bin/env bash
# Builds the multi-call control-plane binary once per (go.sum, sources) and prints its path.
# The binary is cached under hack/kube/.cache/ (ignored by git); Go's own module and build
# caches make a rebuild after a small change quick.
set -euo pipefail
cd "$(dirname "$0")"
command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"  # where the Go tarball installs
V=$(awk '$1 == "k8s.io/kubernetes" {print $2; exit}' go.mod)
V=${V#v}
KEY=$(cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)
OUT=.cache/kube-$KEY
if [ ! -x "$OUT" ]; then
    mkdir -p .cache
    MAJOR=${V%%.*}; MINOR=${V#*.}; MINOR=${MINOR%%.*}
    PKG=k8s.io/component-base/version
    LDFLAGS="-s -w -X $PKG.gitVersion=v$V -X $PKG.gitMajor=$MAJOR -X $PKG.gitMinor=$MINOR"
    LDFLAGS="$LDFLAGS -X $PKG.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=v$V"
    LDFLAGS="$LDFLAGS -X k8s.io/client-go/pkg/version.gitMajor=$MAJOR -X k8s.io/client-go/pkg/version.gitMinor=$MINOR"
    go build -trimpath -ldflags "$LDFLAGS" -o "$OUT.tmp" . >&2
    mv "$OUT.tmp" "$OUT"
    find .cache -maxdepth 1 -name 'kube-*' ! -name "kube-$KEY" -delete
fi
echo "$PWD/$OUT"
