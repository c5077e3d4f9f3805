{{/* The app.kubernetes.io/name label of every object (manifests/ uses valkey-operator). */}}
{{- define "valkey-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Base name of the objects: fullnameOverride, else the release name when it contains the chart's
name (a release named valkey-operator gets the names of manifests/), else <release>-<name>.
*/}}
{{- define "valkey-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "valkey-operator.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The labels of every object: those of manifests/, so both install the same objects. */}}
{{- define "valkey-operator.labels" -}}
app.kubernetes.io/name: {{ include "valkey-operator.name" . }}
{{- end }}

{{/* The operator image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "valkey-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Settings that do not go together fail the rendering with the fix. */}}
{{- define "valkey-operator.validate" -}}
{{- if and (not .Values.leaderElection.enabled) (gt (int .Values.replicas) 1) }}
{{- fail (printf "replicas is %d but leaderElection.enabled is false: without the leader Lease only one operator process may run; set replicas to 1 or enable leader election" (int .Values.replicas)) }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.service.enabled) }}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled: the ServiceMonitor scrapes the operator through its metrics Service" }}
{{- end }}
{{- end }}
