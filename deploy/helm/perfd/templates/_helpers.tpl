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

{{/* Which of the Prometheus operator's objects the values ask for, as YAML (fromYaml): each its own
switch (serviceMonitor.enabled, podMonitor.enabled and .sidecars, prometheusRule.enabled and .dcgm;
podMonitor.enabled covers the shards too, where engine.enabled renders them),
or the older boolean under monitoring (monitoring.serviceMonitor, ...) where a values file still sets
it. Whether the cluster serves their API is the templates' to check. */}}
{{- define "perfd.monitors" -}}
{{- $m := .Values.monitoring -}}
{{- $agents := ternary $m.podMonitor .Values.podMonitor.enabled (kindIs "bool" $m.podMonitor) -}}
serviceMonitor: {{ ternary $m.serviceMonitor .Values.serviceMonitor.enabled (kindIs "bool" $m.serviceMonitor) }}
podMonitor: {{ and $agents .Values.agent.enabled }}
shardPodMonitor: {{ and $agents .Values.engine.enabled }}
sidecarPodMonitor: {{ ternary $m.sidecarPodMonitor (and .Values.podMonitor.enabled .Values.podMonitor.sidecars) (kindIs "bool" $m.sidecarPodMonitor) }}
prometheusRule: {{ ternary $m.prometheusRule .Values.prometheusRule.enabled (kindIs "bool" $m.prometheusRule) }}
dcgmRules: {{ ternary $m.dcgmRules (and .Values.prometheusRule.enabled .Values.prometheusRule.dcgm) (kindIs "bool" $m.dcgmRules) }}
{{- end -}}

{{/* The older monitoring.* switches a values file still sets, each with the key that replaces it. */}}
{{- define "perfd.monitorsRenamed" -}}
{{- $new := dict "serviceMonitor" "serviceMonitor.enabled" "podMonitor" "podMonitor.enabled" "sidecarPodMonitor" "podMonitor.sidecars" "prometheusRule" "prometheusRule.enabled" "dcgmRules" "prometheusRule.dcgm" -}}
{{- range $old, $key := $new -}}
{{- if kindIs "bool" (index $.Values.monitoring $old) }}
monitoring.{{ $old }} -> {{ $key }}
{{- end -}}
{{- end -}}
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

{{/* The engine flags (values.yaml, engine) of a role: `streams` for a shard and a root (they may
make the streams: --engine-replicas; they lease and acknowledge: the engine's timers), not for an
agent. The token is a mounted file. */}}
{{- define "perfd.engineArgs" -}}
{{- $e := .root.Values.engine -}}
- --engine
- {{ join "," $e.urls | quote }}
- --engine-partitions
- {{ $e.partitions | quote }}
{{- if .streams }}
- --engine-replicas
- {{ $e.replicas | quote }}
- --engine-lease-ttl
- {{ $e.leaseTTLSeconds | quote }}
- --engine-ack-wait
- {{ $e.ackWaitSeconds | quote }}
{{- end }}
{{- if $e.tokenSecret }}
- --engine-token-file
- /etc/perfd/engine/token
{{- end }}
{{- if $e.tls.enabled }}
- --engine-tls-ca
- /etc/perfd/engine-tls/ca.crt
{{- if $e.tls.mutual }}
- --engine-tls-cert
- /etc/perfd/engine-tls/tls.crt
- --engine-tls-key
- /etc/perfd/engine-tls/tls.key
{{- end }}
{{- end }}
{{- end -}}

{{/* The engine token's mount and volume (engine.tokenSecret, key `token`; include them only when it
is set): a file, read-only, never an environment variable or an argument. */}}
{{- define "perfd.engineTokenMount" -}}
- name: engine-token
  mountPath: /etc/perfd/engine
  readOnly: true
{{- end -}}

{{- define "perfd.engineTokenVolume" -}}
- name: engine-token
  secret:
    secretName: {{ .root.Values.engine.tokenSecret }}
    items:
      - key: token
        path: token
    defaultMode: {{ .mode }}
{{- end -}}

{{/* The engine's TLS files' mount and volume (engine.tls.secret: ca.crt, and with engine.tls.mutual
tls.crt and tls.key; include them only when engine.tls.enabled): read-only, the key readable by the
container's user and the pod's fsGroup only (`mode`), and only the keys the flags name. */}}
{{- define "perfd.engineTlsMount" -}}
- name: engine-tls
  mountPath: /etc/perfd/engine-tls
  readOnly: true
{{- end -}}

{{- define "perfd.engineTlsVolume" -}}
{{- $t := .root.Values.engine.tls -}}
- name: engine-tls
  secret:
    secretName: {{ $t.secret }}
    items:
      - key: ca.crt
        path: ca.crt
      {{- if $t.mutual }}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
    defaultMode: {{ .mode }}
{{- end -}}

{{/* Refusals of values that would render pods that cannot work (the schema checks the types): the
   remote-write credentials, the engine. */}}
{{- define "perfd.valuesCheck" -}}
{{- with .Values.aggregator.remoteWrite }}
{{- if and .bearerTokenKey .basicAuthUser }}
{{- fail "aggregator.remoteWrite takes bearerTokenKey or basicAuthUser, not both" }}
{{- end }}
{{- if and (or .bearerTokenKey .basicAuthUser .caKey) (not .secret) }}
{{- fail "aggregator.remoteWrite.bearerTokenKey, basicAuthUser and caKey name keys of aggregator.remoteWrite.secret: set it" }}
{{- end }}
{{- end }}
{{- if .Values.engine.enabled }}
{{- if not .Values.engine.urls }}
{{- fail "engine.enabled needs engine.urls: the NATS servers' client URLs, e.g. nats://nats.nats.svc:4222" }}
{{- end }}
{{- if and .Values.engine.root.standby .Values.aggregator.persistence.enabled .Values.aggregator.persistence.existingClaim }}
{{- fail "engine.root.standby runs 2 aggregators, each with a state of its own: they cannot share aggregator.persistence.existingClaim (set engine.root.standby=false to keep one aggregator on that claim)" }}
{{- end }}
{{- end }}
{{- end -}}
