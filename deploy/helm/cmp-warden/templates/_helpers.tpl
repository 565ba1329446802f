{{/* The objects' base name. */}}
{{- define "cmp-warden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cmp-warden.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cmp-warden.fullname" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cmp-warden.labels" -}}
{{ include "cmp-warden.selectorLabels" . }}
app.kubernetes.io/part-of: argocd
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The policy's spec fields, as cmp-warden reads them (a test in crates/policy holds this list
to the parser's). */}}
{{- define "cmp-warden.policySpecFields" -}}
select require namespaces uidRange filesystem network seccomp limits archive env landlock cache
{{- end -}}
