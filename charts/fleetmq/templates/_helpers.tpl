{{- define "fleetmq.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-fleetmq, or the release name when it already holds the chart name. */}}
{{- define "fleetmq.fullname" -}}
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

{{- define "fleetmq.operator.fullname" -}}
{{- printf "%s-operator" (include "fleetmq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleetmq.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleetmq.labels" -}}
helm.sh/chart: {{ include "fleetmq.chart" . }}
app.kubernetes.io/name: {{ include "fleetmq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fleetmq
{{- end }}

{{/* The operator's pods (component labels differ from the broker pods the operator creates). */}}
{{- define "fleetmq.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetmq.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "fleetmq.operator.labels" -}}
{{ include "fleetmq.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "fleetmq.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "fleetmq.operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "fleetmq.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The example zone's first tcp listener, as a dict (the one `helm test` connects to), or an empty dict. */}}
{{- define "fleetmq.examples.tcpListener" -}}
{{- $found := dict }}
{{- range .Values.examples.zone.spec.listeners }}
{{- if and (not $found.name) (eq (default "tcp" .protocol) "tcp") }}
{{- $_ := merge $found . }}
{{- end }}
{{- end }}
{{- toJson $found }}
{{- end }}

{{/* Where `helm test` connects, "<host>:<port>": tests.target, else the example zone's first tcp listener; "" when
neither (no test pod). */}}
{{- define "fleetmq.tests.target" -}}
{{- if .Values.tests.target }}
{{- .Values.tests.target }}
{{- else if .Values.examples.enabled }}
{{- $listener := include "fleetmq.examples.tcpListener" . | fromJson }}
{{- if $listener.name }}
{{- printf "%s-%s-%s:%v" .Values.examples.fleet.name .Values.examples.zone.name $listener.name $listener.port }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fleetmq.tests.podName" -}}
{{- printf "%s-test-mqtt" (include "fleetmq.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* What both pipeline containers share: the password, the volumes, the restricted security context. */}}
{{- define "fleetmq.pipeline.container" -}}
{{- with .pw.name -}}
env:
  - name: REDIS_PASSWORD
    valueFrom:
      secretKeyRef:
        name: {{ . }}
        key: {{ $.pw.key | default "password" }}
{{ end -}}
resources:
  {{- toYaml .p.resources | nindent 2 }}
securityContext:
  {{- toYaml .root.Values.operator.securityContext | nindent 2 }}
volumeMounts:
  - {name: data, mountPath: /data}
  - {name: tmp, mountPath: /tmp}
{{- end }}
