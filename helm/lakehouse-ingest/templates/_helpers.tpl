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

{{/* Where Secrets are mounted: the same paths in the driver and every executor pod. */}}
{{- define "lakehouse-ingest.kafkaCaDir" -}}/etc/lakehouse-ingest/kafka-ca{{- end }}
{{- define "lakehouse-ingest.kafkaClientDir" -}}/etc/lakehouse-ingest/kafka-client{{- end }}
{{- define "lakehouse-ingest.sparkAuthDir" -}}/etc/lakehouse-ingest/spark-auth{{- end }}

{{/* Secret volumes shared by the driver and the executors: the Kafka CA and client
certificate (executors read Kafka too) and, with executors, the key of Spark's RPC
authentication. */}}
{{- define "lakehouse-ingest.secretVolumes" -}}
{{- if .Values.kafka.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .Values.kafka.caSecret }}
    items:
      - key: {{ .Values.kafka.caKey }}
        path: {{ .Values.kafka.caKey }}
{{- end }}
{{- if .Values.kafka.clientSecret }}
- name: kafka-client
  secret:
    secretName: {{ .Values.kafka.clientSecret }}
    # 0440 (group-readable through fsGroup), else 0444: the JVM runs as a non-root user.
    defaultMode: {{ if .Values.podSecurityContext.fsGroup }}288{{ else }}292{{ end }}
    items:
      - key: {{ .Values.kafka.clientKey }}
        path: {{ .Values.kafka.clientKey }}
{{- end }}
{{- if .Values.spark.executors.enabled }}
- name: spark-auth
  secret:
    secretName: {{ .Values.spark.executors.authSecret }}
    # 0440 (group-readable through fsGroup), else 0444: the JVM runs as a non-root user.
    defaultMode: {{ if .Values.podSecurityContext.fsGroup }}288{{ else }}292{{ end }}
    items:
      - key: {{ .Values.spark.executors.authSecretKey }}
        path: {{ .Values.spark.executors.authSecretKey }}
{{- end }}
{{- end }}

{{- define "lakehouse-ingest.secretVolumeMounts" -}}
{{- if .Values.kafka.caSecret }}
- name: kafka-ca
  mountPath: {{ include "lakehouse-ingest.kafkaCaDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.kafka.clientSecret }}
- name: kafka-client
  mountPath: {{ include "lakehouse-ingest.kafkaClientDir" . }}
  readOnly: true
{{- end }}
{{- if .Values.spark.executors.enabled }}
- name: spark-auth
  mountPath: {{ include "lakehouse-ingest.sparkAuthDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/*
spark.* settings the chart manages, as the JSON of INGEST_SPARK_EXTRA_CONF; they win over
spark.executors.extraConf, and values.schema.json refuses them there.
Always: no kill links in the Spark UI. With executors: executor pods owned by this pod
(Kubernetes expands $(POD_NAME)); RPC authenticated with the key of a mounted Secret
(read from the file by the driver and by every executor: Spark then puts no secret in
the executor pods' environment), AES-encrypted RPC and encrypted local disk I/O; and no
clean-up of driver Services or PVCs at stop (Spark created none here), so the Role
needs no rights on them.
*/}}
{{- define "lakehouse-ingest.sparkConf" -}}
{{- $conf := dict "spark.ui.killEnabled" "false" }}
{{- if .Values.spark.executors.enabled }}
{{- $_ := set $conf "spark.kubernetes.driver.pod.name" "$(POD_NAME)" }}
{{- $_ = set $conf "spark.kubernetes.executor.podNamePrefix" (include "lakehouse-ingest.fullname" .) }}
{{- $_ = set $conf "spark.authenticate" "true" }}
{{- $_ = set $conf "spark.authenticate.secret.file" (printf "%s/%s" (include "lakehouse-ingest.sparkAuthDir" .) .Values.spark.executors.authSecretKey) }}
{{- $_ = set $conf "spark.network.crypto.enabled" "true" }}
{{- $_ = set $conf "spark.io.encryption.enabled" "true" }}
{{- $_ = set $conf "spark.kubernetes.driver.service.deleteOnTermination" "false" }}
{{- $_ = set $conf "spark.kubernetes.driver.ownPersistentVolumeClaim" "false" }}
{{- $conf = merge $conf .Values.spark.executors.extraConf }}
{{- end }}
{{- toJson $conf }}
{{- end }}

{{/* The driver's env entries beyond the ConfigMap: secret references and Spark settings. */}}
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
{{- end }}
- name: INGEST_SPARK_EXTRA_CONF
  value: {{ include "lakehouse-ingest.sparkConf" . | quote }}
{{- end }}

{{/* NetworkPolicy egress rule for DNS, wherever the cluster's resolver runs. */}}
{{- define "lakehouse-ingest.dnsEgress" -}}
- ports:
    - port: 53
      protocol: UDP
    - port: 53
      protocol: TCP
{{- end }}

{{/* The container's env entries: secret references, Spark settings, then extraEnv. */}}
{{- define "lakehouse-ingest.containerEnv" -}}
{{- include "lakehouse-ingest.driverEnv" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volume mounts of the driver's (and the toolbox's) container. */}}
{{- define "lakehouse-ingest.containerVolumeMounts" -}}
- name: tmp
  mountPath: /tmp
- name: scratch
  mountPath: /var/lib/lakehouse-ingest
{{- with include "lakehouse-ingest.secretVolumeMounts" . | trim }}
{{ . }}
{{- end }}
{{- if .Values.spark.executors.enabled }}
- name: spark-executor
  mountPath: /etc/lakehouse-ingest/spark
  readOnly: true
{{- end }}
{{- if .Values.contracts }}
- name: contracts
  mountPath: /etc/lakehouse-ingest/contracts
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Volumes of the driver's (and the toolbox's) pod. */}}
{{- define "lakehouse-ingest.podVolumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmp.sizeLimit }}
- name: scratch
  emptyDir:
    {{- with .Values.scratch.medium }}
    medium: {{ . }}
    {{- end }}
    sizeLimit: {{ .Values.scratch.sizeLimit }}
{{- with include "lakehouse-ingest.secretVolumes" . | trim }}
{{ . }}
{{- end }}
{{- if .Values.spark.executors.enabled }}
- name: spark-executor
  configMap:
    name: {{ include "lakehouse-ingest.fullname" . }}-executor
{{- end }}
{{- if .Values.contracts }}
- name: contracts
  configMap:
    name: {{ include "lakehouse-ingest.fullname" . }}-contracts
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Every non-secret setting of the service, as the INGEST_* / AWS_* variables it reads
(the driver's ConfigMap; the toolbox's, rendered with executors off). */}}
{{- define "lakehouse-ingest.settings" -}}
INGEST_KAFKA_BOOTSTRAP_SERVERS: {{ .Values.kafka.bootstrapServers | quote }}
INGEST_USERS_TOPIC: {{ .Values.kafka.usersTopic | quote }}
INGEST_SENSORS_TOPIC: {{ .Values.kafka.sensorsTopic | quote }}
INGEST_KAFKA_SECURITY_PROTOCOL: {{ .Values.kafka.securityProtocol | quote }}
{{- with .Values.kafka.saslMechanism }}
INGEST_KAFKA_SASL_MECHANISM: {{ . | quote }}
{{- end }}
{{- if .Values.kafka.caSecret }}
INGEST_KAFKA_SSL_CA_LOCATION: {{ printf "%s/%s" (include "lakehouse-ingest.kafkaCaDir" .) .Values.kafka.caKey | quote }}
{{- end }}
{{- if .Values.kafka.clientSecret }}
INGEST_KAFKA_SSL_KEYSTORE_LOCATION: {{ printf "%s/%s" (include "lakehouse-ingest.kafkaClientDir" .) .Values.kafka.clientKey | quote }}
{{- end }}
INGEST_STORAGE_ROOT: {{ .Values.storage.root | quote }}
{{- if not (hasKey .Values.config "INGEST_KAFKA_CONSUMER_GROUP") }}
{{- /* One consumer group per release (Kafka's lag tools read it; the service never does). */}}
INGEST_KAFKA_CONSUMER_GROUP: {{ printf "%s/%s" .Release.Namespace (include "lakehouse-ingest.fullname" .) | quote }}
{{- end }}
{{- if .Values.contracts }}
INGEST_CONTRACTS_DIR: "/etc/lakehouse-ingest/contracts"
{{- end }}
{{- with .Values.storage.checkpointRoot }}
INGEST_CHECKPOINT_ROOT: {{ . | quote }}
{{- end }}
{{- with .Values.s3.endpoint }}
AWS_ENDPOINT_URL: {{ . | quote }}
{{- end }}
AWS_REGION: {{ .Values.s3.region | quote }}
INGEST_HTTP_PORT: {{ .Values.httpPort | quote }}
INGEST_STOP_TIMEOUT_SECONDS: {{ .Values.stopTimeoutSeconds | quote }}
INGEST_SPARK_DRIVER_MEMORY: {{ .Values.spark.driverMemory | quote }}
INGEST_SPARK_UI_PORT: {{ .Values.spark.uiPort | quote }}
INGEST_SPARK_LOCAL_DIR: "/var/lib/lakehouse-ingest/spark-local"
{{- if .Values.spark.executors.enabled }}
INGEST_SPARK_MASTER: {{ .Values.spark.executors.master | quote }}
INGEST_SPARK_DRIVER_HOST: {{ printf "%s.%s.svc" (include "lakehouse-ingest.driverServiceName" .) .Release.Namespace | quote }}
INGEST_SPARK_DRIVER_BIND_ADDRESS: "0.0.0.0"
INGEST_SPARK_DRIVER_PORT: {{ .Values.spark.executors.driverPort | quote }}
INGEST_SPARK_DRIVER_BLOCK_MANAGER_PORT: {{ .Values.spark.executors.blockManagerPort | quote }}
INGEST_SPARK_EXECUTOR_INSTANCES: {{ .Values.spark.executors.instances | quote }}
INGEST_SPARK_EXECUTOR_CORES: {{ .Values.spark.executors.cores | quote }}
INGEST_SPARK_EXECUTOR_MEMORY: {{ .Values.spark.executors.memory | quote }}
INGEST_SPARK_KUBERNETES_CONTAINER_IMAGE: {{ default (include "lakehouse-ingest.image" .) .Values.spark.executors.image | quote }}
INGEST_SPARK_KUBERNETES_NAMESPACE: {{ .Release.Namespace | quote }}
INGEST_SPARK_KUBERNETES_SERVICE_ACCOUNT: {{ include "lakehouse-ingest.serviceAccountName" . | quote }}
INGEST_SPARK_KUBERNETES_EXECUTOR_POD_TEMPLATE: "/etc/lakehouse-ingest/spark/executor-pod-template.yaml"
{{- else }}
INGEST_SPARK_MASTER: "local[*]"
{{- end }}
{{- /* Numbers exactly as written: Helm reads a values file's numbers as floats, which
toString would print as 1e+06; toJson prints 1000000, 10000000000 and 0.5. */}}
{{- range $key, $value := .Values.config }}
{{ $key }}: {{ kindIs "string" $value | ternary $value (toJson $value) | quote }}
{{- end }}
{{- end }}

{{/* A Prometheus duration of one unit ("90s", "5m", "2h", "1d") in seconds; 0 otherwise. */}}
{{- define "lakehouse-ingest.durationSeconds" -}}
{{- $text := toString . }}
{{- $number := regexFind "^[0-9]+" $text }}
{{- $unit := get (dict "s" 1 "m" 60 "h" 3600 "d" 86400) (trimPrefix $number $text) | default 0 }}
{{- mul (int64 (default "0" $number)) (int64 $unit) }}
{{- end }}

{{/* Whether the cluster serves the Prometheus Operator's AlertmanagerConfig. */}}
{{- define "lakehouse-ingest.hasAlertmanagerConfigApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1alpha1/AlertmanagerConfig" }}true{{ end }}
{{- end }}

{{/* Alertmanager matcher strings (`name="value"`, `=~`, `!=`, `!~`) as AlertmanagerConfig
matchers; one that does not parse fails the render. */}}
{{- define "lakehouse-ingest.matchers" -}}
{{- $pattern := `^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"(.*)"\s*$` }}
{{- range . }}
{{- if not (regexMatch $pattern .) }}
{{- fail (printf "files/alertmanager/alertmanager.yml: matcher %q is not name<op>\"value\"" .) }}
{{- end }}
- name: {{ regexReplaceAll $pattern . "${1}" }}
  matchType: {{ regexReplaceAll $pattern . "${2}" | quote }}
  value: {{ regexReplaceAll $pattern . "${3}" | quote }}
{{- end }}
{{- end }}
