{{- define "cc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "cc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "cc.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cc.labels" -}}
app.kubernetes.io/name: {{ include "cc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cc.adminSecret" -}}
{{- if .Values.adminToken.existingSecret -}}{{ .Values.adminToken.existingSecret }}{{- else -}}{{ include "cc.fullname" . }}-admin{{- end -}}
{{- end -}}

{{- define "cc.adminEnabled" -}}
{{- if or .Values.adminToken.existingSecret .Values.adminToken.value -}}true{{- end -}}
{{- end -}}

{{- define "cc.sidecarConfig" -}}
{{- $c := deepCopy .Values.config -}}
{{- $listen := dict "host" "0.0.0.0" "port" 8787 -}}
{{- if .Values.service.adminPort -}}
{{- $_ := set $listen "admin_port" 9090 -}}
{{- end -}}
{{- $_ := set $c "listen" $listen -}}
{{- $_ := set $c "ceilings_file" "/etc/context-ceiling/ceilings/ceilings.yaml" -}}
{{- $_ := set $c "ceilings_persist" false -}}
{{- if include "cc.captureEnabled" . -}}
{{- $cap := deepCopy $c.capture -}}
{{- $_ := set $cap "store" "/var/lib/context-ceiling/capture/capture-{hostname}.sqlite" -}}
{{- $_ := set $c "capture" $cap -}}
{{- end -}}
{{- toYaml $c -}}
{{- end -}}

{{- /* The `job` label Prometheus gives this release's series: the Service's name, or with
serviceMonitor.jobLabel the value of that label on the Service (the operator's rule). */}}
{{- define "cc.jobName" -}}
{{- $labels := merge (include "cc.labels" . | fromYaml) (deepCopy (.Values.service.labels | default dict)) -}}
{{- $key := .Values.serviceMonitor.jobLabel -}}
{{- if and $key (hasKey $labels $key) -}}{{ index $labels $key }}{{- else -}}{{ include "cc.fullname" . }}{{- end -}}
{{- end -}}

{{- define "cc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}{{ .Values.serviceAccount.name | default (include "cc.fullname" .) }}{{- else -}}{{ .Values.serviceAccount.name | default "default" }}{{- end -}}
{{- end -}}

{{- define "cc.captureEnabled" -}}
{{- if and .Values.config.capture .Values.config.capture.enabled -}}true{{- end -}}
{{- end -}}

{{/* The sidecar image: by digest when one is given (immutable), else by tag. */}}
{{- define "cc.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}
