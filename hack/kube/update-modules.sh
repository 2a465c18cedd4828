#!/usr/bin/env bash
# Points go.mod at one Kubernetes release. k8s.io/kubernetes replaces every staging module
# with ./staging/..., which a module outside its tree cannot follow; so require it and replace
# each staging module it lists at v0.0.0 with the published v0.<minor>.<patch>. The list
# changes between minors, so it is generated from that release's own go.mod.
# Usage: hack/kube/update-modules.sh 1.37.2
set -euo pipefail
cd "$(dirname "$0")"
V=${1:?usage: update-modules.sh 1.MINOR.PATCH}
go mod edit -require="k8s.io/kubernetes@v$V"
M=$(go mod download -json "k8s.io/kubernetes@v$V" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
for m in $(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$M"); do
    go mod edit -replace="$m=$m@v0.${V#1.}"
done
go mod tidy
