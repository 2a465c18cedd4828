{{/* The chart's name, or nameOverride. */}}
{{- define "topology-webhook.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release-scoped name, at most 63 characters (a DNS label); fullnameOverride replaces it. */}}
{{- define "topology-webhook.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "topology-webhook.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The webhook's ServiceAccount: made by the chart (serviceAccount.create), or one you made. */}}
{{- define "topology-webhook.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "topology-webhook.fullname" .) -}}
{{- end -}}

{{- define "topology-webhook.instanceLabels" -}}
app.kubernetes.io/name: {{ include "topology-webhook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The webhook's pods; the discovery agent's pods carry component=discovery instead. */}}
{{- define "topology-webhook.selectorLabels" -}}
{{ include "topology-webhook.instanceLabels" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- define "topology-webhook.labels" -}}
{{ include "topology-webhook.instanceLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "topology-webhook.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The Secret holding the serving certificate (tls.crt, tls.key). */}}
{{- define "topology-webhook.tlsSecretName" -}}
{{- if eq .Values.tls.mode "existingSecret" -}}
{{- .Values.tls.existingSecret.name -}}
{{- else -}}
{{- include "topology-webhook.fullname" . }}-tls
{{- end -}}
{{- end -}}

{{/* tls.mode selfManaged: the Secret the webhook keeps its CA and serving certificate in (not
rendered: the first replica creates it). */}}
{{- define "topology-webhook.selfManagedSecretName" -}}
{{- include "topology-webhook.fullname" . }}-self-managed-tls
{{- end -}}

{{/* Every DNS name the apiserver may use for the Service; the serving certificate covers them all. */}}
{{- define "topology-webhook.dnsNames" -}}
{{- $svc := include "topology-webhook.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.tls.clusterDomain) | toJson -}}
{{- end -}}

{{- define "topology-webhook.configPath" -}}/etc/topology-webhook/config/config.yaml{{- end -}}
{{- define "topology-webhook.tlsDir" -}}/etc/topology-webhook/tls{{- end -}}
{{- define "topology-webhook.clientCADir" -}}/etc/topology-webhook/client-ca{{- end -}}

{{/* Restricted Pod Security Standard: non-root, no privilege escalation, no capabilities,
seccomp; podSecurityContext adds to it or changes it (fsGroupChangePolicy, supplementalGroups...). */}}
{{- define "topology-webhook.podSecurityContext" -}}
{{- $restricted := dict "runAsNonRoot" true "runAsUser" 65532 "runAsGroup" 65532 "fsGroup" 65532 "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- toYaml (mergeOverwrite $restricted (deepCopy .Values.podSecurityContext)) -}}
{{- end -}}

{{- define "topology-webhook.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/*
CEL guard for a dotted path: has() on every step below `object`, so a missing field makes the
condition false instead of an evaluation error. "object.spec.schedulerName" gives
"has(object.spec) && has(object.spec.schedulerName)".
*/}}
{{- define "topology-webhook.celPresent" -}}
{{- $parts := splitList "." . -}}
{{- $checks := list -}}
{{- range $i, $_ := $parts -}}
{{- if gt $i 0 -}}
{{- $checks = append $checks (printf "has(%s)" (slice $parts 0 (add1 $i) | join ".")) -}}
{{- end -}}
{{- end -}}
{{- join " && " $checks -}}
{{- end -}}

{{/*
The webhook's match condition: the object, its pod template (Deployment, StatefulSet, ReplicaSet,
Job) or its job's pod template (CronJob) carries a topology.scheduler/ annotation or names one of
the schedulers the webhook stands in for.
*/}}
{{- define "topology-webhook.matchExpression" -}}
{{- $schedulers := toJson .Values.config.scheduler_names -}}
{{- $terms := list -}}
{{- range $pod := list "object" "object.spec.template" "object.spec.jobTemplate.spec.template" -}}
{{- $annotations := printf "%s.metadata.annotations" $pod -}}
{{- $terms = append $terms (printf "(%s && %s.exists(k, k.startsWith('topology.scheduler/') || k in %s))" (include "topology-webhook.celPresent" $annotations) $annotations (include "topology-webhook.peerAnnotations" .)) -}}
{{- $scheduler := printf "%s.spec.schedulerName" $pod -}}
{{- $terms = append $terms (printf "(%s && %s in %s)" (include "topology-webhook.celPresent" $scheduler) $scheduler $schedulers) -}}
{{- end -}}
{{- join "\n|| " $terms -}}
{{- end -}}

{{/*
Where the apiserver sends reviews, and for which namespaces.
Called with (list . fullname caBundle).
*/}}
{{- define "topology-webhook.webhookTarget" -}}
{{- $root := index . 0 -}}
clientConfig:
  service:
    name: {{ index . 1 }}
    namespace: {{ $root.Release.Namespace }}
    path: /mutate
    port: {{ $root.Values.service.port }}
  {{- with index . 2 }}
  caBundle: {{ . }}
  {{- end }}
namespaceSelector:
  matchExpressions:
    # The release's own namespace is always excluded: the webhook never gates its own pods.
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- toYaml (append $root.Values.webhook.excludeNamespaces $root.Release.Namespace | uniq) | nindent 8 }}
  {{- with $root.Values.webhook.namespaceLabels }}
  matchLabels:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- with $root.Values.webhook.objectSelector }}
objectSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
Stop with a clear message when a custom resource the values ask for has no CRD in the cluster
(instead of kubectl's "no matches for kind"). `helm template` knows only what --api-versions
tells it: set crdCheck=false there (Argo CD and Flux pass the cluster's API versions).
Arguments: (list . "group/version/Kind" "the value that asks for it").
*/}}
{{- define "topology-webhook.requireCRD" -}}
{{- $root := index . 0 -}}
{{- $apiVersion := index . 1 -}}
{{- if and $root.Values.crdCheck (not ($root.Capabilities.APIVersions.Has $apiVersion)) -}}
{{- fail (printf "%s needs the CRD %s, which this cluster does not have: install it first (or, rendering with helm template, pass --api-versions %s or set crdCheck=false)" (index . 2) $apiVersion $apiVersion) -}}
{{- end -}}
{{- end -}}

{{/*
The peers' topology annotations the webhook reads as its own (webhook/objects/user_annotations.py), as a CEL list.
*/}}
{{- define "topology-webhook.peerAnnotations" -}}
["kueue.x-k8s.io/podset-required-topology", "kueue.x-k8s.io/podset-preferred-topology", "kai.scheduler/topology-required-placement", "kai.scheduler/topology-preferred-placement"]
{{- end -}}

{{/*
The operators' resources to register (webhook.operators): every one whose API the cluster serves
under auto, or those of the listed API groups; as a JSON list of {group, version, resource}.
*/}}
{{- define "topology-webhook.operators" -}}
{{- $known := (.Files.Get "files/kinds.yaml" | fromYaml).operators -}}
{{- $chosen := list -}}
{{- range $operator := $known -}}
{{- $served := $.Capabilities.APIVersions.Has (printf "%s/%s/%s" $operator.group $operator.version $operator.kind) -}}
{{- if or (and (eq (toString $.Values.webhook.operators) "auto") $served) (and (kindIs "slice" $.Values.webhook.operators) (has $operator.group $.Values.webhook.operators)) -}}
{{- $chosen = append $chosen $operator -}}
{{- end -}}
{{- end -}}
{{- toJson $chosen -}}
{{- end -}}
