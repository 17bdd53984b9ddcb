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


{{- define "perfd.authSecret" -}}
{{ .Values.auth.existingSecret | default (printf "%s-auth" .Release.Name) }}
{{- end -}}

{{/* Pod-spec fields both workloads take from values: pull secrets, priority class. */}}
{{- define "perfd.podCommon" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
