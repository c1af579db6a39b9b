{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "distrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name, plus the chart name unless the release already contains it. */}}
{{- define "distrain.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "distrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "distrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "distrain.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "distrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: distrain
{{- end -}}

{{- define "distrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "distrain.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "distrain.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "distrain.workerImage" -}}
{{- printf "%s:%s" .Values.workerImage.repository (default (default .Chart.AppVersion .Values.image.tag) .Values.workerImage.tag) -}}
{{- end -}}

{{- define "distrain.workerCudaImage" -}}
{{- printf "%s:%s" .Values.workerCudaImage.repository (default (default .Chart.AppVersion .Values.image.tag) .Values.workerCudaImage.tag) -}}
{{- end -}}
