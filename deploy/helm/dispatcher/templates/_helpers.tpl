{{/* The chart's name, nameOverride applied. */}}
{{- define "dispatcher.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' name: release-chart, or the release alone when it holds the chart's name. */}}
{{- define "dispatcher.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "dispatcher.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "dispatcher.labels" -}}
helm.sh/chart: {{ include "dispatcher.chart" . }}
{{ include "dispatcher.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels the Deployment, Service and PDB select the pods by: never changed by an upgrade. */}}
{{- define "dispatcher.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dispatcher.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "dispatcher.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dispatcher.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "dispatcher.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
dispatcher.envName is the <NAME> of a queue's variables, as the dispatcher
spells it (config.EnvName): upper-cased, every character outside A-Z 0-9
written as _.
*/}}
{{- define "dispatcher.envName" -}}
{{- regexReplaceAll "[^A-Z0-9]" (upper .) "_" }}
{{- end }}

{{/*
dispatcher.urlSecret is the secretKeyRef of a URL ("redis" or "amqp"): the
existing Secret when one is named, the chart's own otherwise.
*/}}
{{- define "dispatcher.urlSecret" -}}
{{- $v := index .root.Values .which }}
{{- if $v.existingSecret.name }}
name: {{ $v.existingSecret.name }}
key: {{ required (printf "%s.existingSecret.key: the key of the URL in Secret %s" .which $v.existingSecret.name) $v.existingSecret.key }}
{{- else }}
name: {{ include "dispatcher.fullname" .root }}
key: {{ .which }}-url
{{- end }}
{{- end }}

{{/* dispatcher.ownSecret is true when the chart creates a Secret (a URL not from an existing one). */}}
{{- define "dispatcher.ownSecret" -}}
{{- if or (not .Values.redis.existingSecret.name) (not .Values.amqp.existingSecret.name) }}true{{ end }}
{{- end }}

{{/*
dispatcher.configEnv maps the keys of .Values.config to the dispatcher's
variables. The schema allows exactly these keys.
*/}}
{{- define "dispatcher.configEnv" -}}
keyPrefix: DISPATCHER_KEY_PREFIX
lease: DISPATCHER_LEASE
batchSize: DISPATCHER_BATCH_SIZE
pipeline: DISPATCHER_PIPELINE
pollInterval: DISPATCHER_POLL_INTERVAL
idlePollInterval: DISPATCHER_IDLE_POLL_INTERVAL
lookahead: DISPATCHER_LOOKAHEAD
publishTick: DISPATCHER_PUBLISH_TICK
confirmTimeout: DISPATCHER_CONFIRM_TIMEOUT
maxMessageBytes: DISPATCHER_MAX_MESSAGE_BYTES
maxAttempts: DISPATCHER_MAX_ATTEMPTS
retryMin: DISPATCHER_RETRY_MIN
retryMax: DISPATCHER_RETRY_MAX
stampPublished: DISPATCHER_STAMP_PUBLISHED
statsInterval: DISPATCHER_STATS_INTERVAL
stallAfter: DISPATCHER_STALL_AFTER
logLevel: DISPATCHER_LOG_LEVEL
logFormat: DISPATCHER_LOG_FORMAT
amqpNodeOrder: DISPATCHER_AMQP_NODE_ORDER
{{- end }}

{{/*
dispatcher.value writes a value for an env var: integers without an
exponent (Helm reads numbers from YAML as floats, and 16777216 would print
as 1.6777216e+07), everything else as it prints.
*/}}
{{- define "dispatcher.value" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) }}
{{- printf "%.0f" . | quote }}
{{- else }}
{{- toString . | quote }}
{{- end }}
{{- end }}
