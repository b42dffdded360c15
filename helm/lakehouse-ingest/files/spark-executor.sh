#!/bin/bash
# Start a Spark-on-Kubernetes executor JVM from the lakehouse-ingest image.
#
# Spark creates executor pods with the argument "executor" and the SPARK_* variables
# below (as Spark's own image entrypoint expects); the lakehouse-ingest image's
# entrypoint is the driver's CLI, so the executor pod template runs this script instead.
set -euo pipefail

if [[ "${1:-executor}" != "executor" ]]; then
  echo "spark-executor.sh: unsupported command ${1}" >&2
  exit 64
fi

# SPARK_JAVA_OPT_0..n carry spark.executor.extraJavaOptions and Spark's own flags, in order.
java_opts=()
while IFS= read -r opt; do
  java_opts+=("${opt}")
done < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')

# SPARK_CLASSPATH is spark.executor.extraClassPath: the image's baked jars.
exec java "${java_opts[@]}" \
  -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
  -cp "${SPARK_CLASSPATH:+${SPARK_CLASSPATH}:}${SPARK_HOME}/jars/*" \
  org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
  --driver-url "${SPARK_DRIVER_URL}" \
  --executor-id "${SPARK_EXECUTOR_ID}" \
  --cores "${SPARK_EXECUTOR_CORES}" \
  --app-id "${SPARK_APPLICATION_ID}" \
  --hostname "${SPARK_EXECUTOR_POD_IP}" \
  --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID}" \
  --podName "${SPARK_EXECUTOR_POD_NAME}"
