{{/* The chart's name, at most 63 characters (a DNS label). */}}
{{- define "admit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's objects' name. */}}
{{- define "admit.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "admit.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "admit.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "admit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "admit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "admit.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "admit.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "admit.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "admit.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the admin token, and its key. */}}
{{- define "admit.tokenSecret" -}}
{{- default (printf "%s-admin" (include "admit.fullname" .)) .Values.adminToken.existingSecret -}}
{{- end -}}
{{- define "admit.tokenKey" -}}
{{- if .Values.adminToken.existingSecret -}}{{ .Values.adminToken.existingSecretKey }}{{- else -}}token{{- end -}}
{{- end -}}

{{/* Whether the pods share a Redis store. */}}
{{- define "admit.redis" -}}
{{- if or .Values.redis.url .Values.redis.existingSecret -}}true{{- end -}}
{{- end -}}

{{/*
admit.home: the region holds its limits with others through a home Redis;
it needs a name and its own Redis.
*/}}
{{- define "admit.home" -}}
{{- if or .Values.region.home.url .Values.region.home.existingSecret -}}
{{- if not .Values.region.name -}}
{{- fail "region.home needs region.name, this region's name" -}}
{{- end -}}
{{- if not (include "admit.redis" .) -}}
{{- fail "region.home needs redis.url (or redis.existingSecret): the region's own Redis" -}}
{{- end -}}
true
{{- else if .Values.region.name -}}
{{- fail "region.name needs region.home.url (or region.home.existingSecret), the Redis the regions share" -}}
{{- end -}}
{{- end -}}

{{/*
store.instances: what the values say, else the most pods that can run,
so that local decisions during a Redis outage never add up past a limit.
*/}}
{{- define "admit.instances" -}}
{{- if .Values.instances -}}
{{- .Values.instances -}}
{{- else if .Values.autoscaling.enabled -}}
{{- .Values.autoscaling.maxReplicas -}}
{{- else -}}
{{- .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* Refuse values that would deploy something that cannot work. */}}
{{- define "admit.validate" -}}
{{- if and (not (include "admit.redis" .)) (or .Values.autoscaling.enabled (gt (int .Values.replicaCount) 1)) -}}
{{- fail "more than one pod needs redis.url (or redis.existingSecret): the memory store keeps its limits inside one pod, so each pod would admit the whole limit" -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) -}}
{{- fail "autoscaling.maxReplicas is less than autoscaling.minReplicas" -}}
{{- end -}}
{{- if lt (int .Values.terminationGracePeriodSeconds) (add (int .Values.preStopSleepSeconds) 10) -}}
{{- fail (printf "terminationGracePeriodSeconds (%v) must cover preStopSleepSeconds (%v) and Admit's drain (10 s)" .Values.terminationGracePeriodSeconds .Values.preStopSleepSeconds) -}}
{{- end -}}
{{- if not (kindIs "map" .Values.config) -}}
{{- fail "config must be a mapping: Admit's configuration file" -}}
{{- end -}}
{{- end -}}

{{/* The configuration file: the values' config with store.instances set. */}}
{{- define "admit.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $store := default dict (get $cfg "store") -}}
{{- $_ := set $store "instances" (int (include "admit.instances" .)) -}}
{{- $_ := set $cfg "store" $store -}}
{{- toYaml $cfg -}}
{{- end -}}
