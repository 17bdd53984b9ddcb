{{- define "perfd.labels" -}}
app.kubernetes.io/name: perfd
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "perfd.selector" -}}
app.kubernetes.io/name: perfd
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "perfd.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "perfd.aggregator" -}}
{{ .Release.Name }}-aggregator
{{- end -}}
