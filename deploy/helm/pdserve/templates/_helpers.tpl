{{/* The chart's common labels. */}}
{{- define "pdserve.labels" -}}
app.kubernetes.io/name: pdserve
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Seconds a pod may take to stop: preStop + drain + shutdown + 5 s. */}}
{{- define "pdserve.gracePeriod" -}}
{{- $drain := .Values.drainTimeout | toString | trimSuffix "s" | int -}}
{{- add $drain .Values.preStopSeconds 35 -}}
{{- end -}}

{{/* Probes shared by every pdserve container. */}}
{{- define "pdserve.probes" -}}
readinessProbe:
  httpGet:
    path: /health
    port: http
  periodSeconds: 2
  failureThreshold: 2
livenessProbe:
  httpGet:
    path: /livez
    port: http
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}

{{/* The OTLP endpoint every pdserve pod sends its spans to: the chart's
Jaeger when tracing.jaeger.enabled, else tracing.otlpEndpoint ("": off). */}}
{{- define "pdserve.otlpEndpoint" -}}
{{- if .Values.tracing.jaeger.enabled -}}
grpc://{{ .Release.Name }}-jaeger:4317
{{- else -}}
{{- .Values.tracing.otlpEndpoint -}}
{{- end -}}
{{- end -}}

{{/* "true" when the router's planner scales the worker Deployments (then
the chart leaves their replica counts to it). Fails on an unknown scaler. */}}
{{- define "pdserve.plannerScales" -}}
{{- if .Values.planner.enabled -}}
{{- if not (has .Values.planner.scaler (list "kubernetes" "none")) -}}
{{- fail (printf "planner.scaler %q: want kubernetes or none" .Values.planner.scaler) -}}
{{- end -}}
{{- if eq .Values.planner.scaler "kubernetes" -}}true{{- end -}}
{{- end -}}
{{- end -}}
