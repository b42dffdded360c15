{{/* Chart name, truncated to the 63 characters Kubernetes allows in names. */}}
{{- define "lakehouse-ingest.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name. */}}
{{- define "lakehouse-ingest.fullname" -}}
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

{{- define "lakehouse-ingest.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades. */}}
{{- define "lakehouse-ingest.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lakehouse-ingest.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Common labels. */}}
{{- define "lakehouse-ingest.labels" -}}
helm.sh/chart: {{ include "lakehouse-ingest.chart" . }}
{{ include "lakehouse-ingest.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: lakehouse-ingest
{{- end }}

{{- define "lakehouse-ingest.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lakehouse-ingest.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "lakehouse-ingest.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The headless Service executors reach the driver through. */}}
{{- define "lakehouse-ingest.driverServiceName" -}}
{{- printf "%s-driver" (include "lakehouse-ingest.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Whether the cluster runs the Prometheus Operator. */}}
{{- define "lakehouse-ingest.hasMonitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end }}
{{- end }}

{{/* S3 credentials as env entries (secret references only), shared by driver and executors. */}}
{{- define "lakehouse-ingest.s3CredentialsEnv" -}}
{{- if .Values.s3.existingSecret }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.existingSecret }}
      key: {{ .Values.s3.accessKeyIdKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.s3.existingSecret }}
      key: {{ .Values.s3.secretAccessKeyKey }}
{{- end }}
{{- end }}

{{/* The driver's env entries beyond the ConfigMap: secret references and executor wiring. */}}
{{- define "lakehouse-ingest.driverEnv" -}}
{{- include "lakehouse-ingest.s3CredentialsEnv" . }}
{{- if .Values.kafka.existingSecret }}
- name: INGEST_KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.existingSecret }}
      key: {{ .Values.kafka.usernameKey }}
- name: INGEST_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.existingSecret }}
      key: {{ .Values.kafka.passwordKey }}
{{- end }}
{{- if .Values.spark.executors.enabled }}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
{{- /* Executor pods are owned by this pod and go with it; Kubernetes expands $(POD_NAME). */}}
- name: INGEST_SPARK_EXTRA_CONF
  value: {{ merge (dict "spark.kubernetes.driver.pod.name" "$(POD_NAME)" "spark.kubernetes.executor.podNamePrefix" (include "lakehouse-ingest.fullname" .)) .Values.spark.executors.extraConf | toJson | quote }}
{{- end }}
{{- end }}
