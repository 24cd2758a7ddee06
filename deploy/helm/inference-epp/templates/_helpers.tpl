{{/* The InferencePool's name: inferencePool.name, else the release name. */}}
{{- define "epp.poolName" -}}
{{- .Values.inferencePool.name | default .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The EPP's objects: <pool>-epp, as in deploy/kubernetes. */}}
{{- define "epp.fullname" -}}
{{- .Values.fullnameOverride | default (printf "%s-epp" (include "epp.poolName" .)) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "epp.selectorLabels" -}}
app: {{ include "epp.fullname" . }}
{{- end -}}

{{- define "epp.labels" -}}
{{ include "epp.selectorLabels" . }}
app.kubernetes.io/name: inference-epp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "epp.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "epp.fullname" .) -}}
{{- end -}}

{{- define "epp.configMapName" -}}
{{- .Values.config.existingConfigMap | default (printf "%s-config" (include "epp.fullname" .)) -}}
{{- end -}}

{{/* "true" when the chart writes the config's ConfigMap. */}}
{{- define "epp.writesConfig" -}}
{{- if and (not .Values.config.existingConfigMap) (or .Values.config.inline .Values.activeActive.enabled) -}}true{{- end -}}
{{- end -}}

{{/* "true" when the EPP reads a config file (else it runs its built-in default). */}}
{{- define "epp.hasConfig" -}}
{{- if or .Values.config.existingConfigMap (include "epp.writesConfig" .) -}}true{{- end -}}
{{- end -}}

{{- define "epp.redisName" -}}
{{- printf "%s-redis" (include "epp.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "epp.redisUrl" -}}
{{- if .Values.activeActive.redis.create -}}
{{- printf "redis://%s:6379" (include "epp.redisName" .) -}}
{{- else -}}
{{- required "activeActive.redis.url is required when activeActive.redis.create is false" .Values.activeActive.redis.url -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the Redis password ("" when Redis has none). */}}
{{- define "epp.redisSecret" -}}
{{- if .Values.activeActive.redis.existingSecret -}}
{{- .Values.activeActive.redis.existingSecret -}}
{{- else if .Values.activeActive.redis.password -}}
{{- include "epp.redisName" . -}}
{{- end -}}
{{- end -}}

{{/* The config the chart writes for active-active without a config of the user's: the built-in
default scheduling (a config that declares no scheduling plugin gets it) plus the redis-syncer. */}}
{{- define "epp.activeActiveConfig" -}}
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: redis-syncer
  parameters:
    url: {{ include "epp.redisUrl" . }}
    {{- if include "epp.redisSecret" . }}
    passwordFile: /var/run/secrets/redis/password
    {{- end }}
dataLayer:
  crossReplicaSyncerPluginRef: redis-syncer
  crossReplicaSyncInterval: {{ .Values.activeActive.syncInterval }}
{{- end -}}

{{/* PromQL matchers of this EPP's series (the ServiceMonitor's job is the Service's name). */}}
{{- define "epp.promSelector" -}}
job="{{ include "epp.fullname" . }}", namespace="{{ .Release.Namespace }}"
{{- end -}}

{{/* Checks of values that cannot work together. */}}
{{- define "epp.validate" -}}
{{- if and .Values.ha.leaderElection .Values.activeActive.enabled -}}
{{- fail "ha.leaderElection and activeActive.enabled exclude each other: a leader-elected EPP has one serving replica, active-active has all of them serve" -}}
{{- end -}}
{{- if and .Values.inferencePool.create (not .Values.inferencePool.selector) -}}
{{- fail "inferencePool.selector (the model-server pods' matchLabels) is required when inferencePool.create is true" -}}
{{- end -}}
{{- if and .Values.config.inline .Values.config.existingConfigMap -}}
{{- fail "config.inline and config.existingConfigMap exclude each other" -}}
{{- end -}}
{{- end -}}

{{/* The config text the chart writes (epp.writesConfig): config.inline, else the active-active
config. */}}
{{- define "epp.configText" -}}
{{- if not .Values.config.inline -}}
{{- include "epp.activeActiveConfig" . -}}
{{- else if kindIs "string" .Values.config.inline -}}
{{- .Values.config.inline | trimSuffix "\n" -}}
{{- else -}}
{{- toYaml .Values.config.inline -}}
{{- end -}}
{{- end -}}
