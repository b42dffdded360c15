# syntax=docker/dockerfile:1
# lakehouse-ingest: the PySpark driver with its Spark-side jars baked in.
#
# One source of truth for versions: the jars come from deploy/jvm/spark/pom.xml (the
# manifest `make jars` resolves), Python packages from pyproject.toml constrained by
# requirements.lock. Base images are pinned by tag; Debian packages follow the pinned
# Debian release (bookworm) so security updates land on rebuild.
#
#   docker build -t lakehouse-ingest:0.1.0 .
#   docker run --rm lakehouse-ingest:0.1.0 --help
#
# The base images are build arguments so that a machine without a registry can build
# the same image from bases it made itself (`make image` does, with Debian bookworm's
# python3.11 and Maven from mmdebstrap: deploy/image/build.sh). A machine whose TLS is
# intercepted passes its CA bundle and Java truststore as build secrets `build-ca` and
# `build-truststore`: only the build steps that download read them, no layer keeps them.
ARG MAVEN_IMAGE=maven:3.9.11-eclipse-temurin-17
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# ---- stage 1: JVM jars from Maven Central (same manifest and flags as `make jars`), and
# ---- the service's Java (the fast path's checker, the local file system) from jvm/checker ----
FROM ${MAVEN_IMAGE} AS jars
WORKDIR /build/deploy/jvm/spark
COPY deploy/jvm/settings.xml /build/deploy/jvm/settings.xml
COPY deploy/jvm/spark/pom.xml /build/deploy/jvm/spark/pom.xml
COPY jvm/checker /build/jvm/checker
RUN --mount=type=cache,target=/root/.m2 --mount=type=secret,id=build-truststore \
    if [ -f /run/secrets/build-truststore ]; then \
      export MAVEN_OPTS="-Djavax.net.ssl.trustStore=/run/secrets/build-truststore"; fi \
 && mvn -B -q -s ../settings.xml dependency:copy-dependencies \
      -DexcludeTransitive=true -DoutputDirectory=/opt/lakehouse-ingest/jars \
 && mvn -B -q -s ../settings.xml -f /build/jvm/checker/pom.xml -Dmaven.test.skip=true package \
 && cp /build/jvm/checker/target/lakehouse-ingest-checker-1.jar /opt/lakehouse-ingest/jars/

# ---- stage 2: the Python virtualenv (pinned by requirements.lock) ----
FROM ${PYTHON_IMAGE} AS python
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (a layer that survives code changes), read from pyproject.toml itself.
# The same pip on either base, so the venv is laid out the same.
COPY pyproject.toml requirements.lock ./
RUN --mount=type=secret,id=build-ca \
    if [ -f /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi \
 && python3 -m venv /opt/venv \
 && pip install --no-cache-dir pip==26.3 \
 && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install --no-cache-dir -c requirements.lock -r /tmp/requirements.txt
COPY README.md ./
COPY service ./service
RUN --mount=type=secret,id=build-ca \
    if [ -f /run/secrets/build-ca ]; then export PIP_CERT=/run/secrets/build-ca; fi \
 && pip install --no-cache-dir --no-deps -c requirements.lock . \
 && lakehouse-ingest --help > /dev/null \
 && python -m pip uninstall --yes --quiet pip setuptools

# ---- stage 3: runtime ----
FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="lakehouse-ingest" \
      org.opencontainers.image.description="Kafka to Delta Lake streaming ingest (PySpark Structured Streaming)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# Java 17 runs Spark; tini is PID 1 (reaps the JVM's children, forwards SIGTERM to the
# driver); curl and procps (pgrep, pkill) are what the runbooks run inside the container.
# The man directory must exist for the JRE's post-install step on slim images.
# hadolint ignore=DL3008
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless tini curl procps \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 ingest \
 && useradd --system --uid 10001 --gid ingest --no-create-home \
      --home-dir /var/lib/lakehouse-ingest --shell /usr/sbin/nologin ingest \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/lakehouse-ingest
COPY --from=jars /opt/lakehouse-ingest/jars /opt/lakehouse-ingest/jars
COPY --from=python /opt/venv /opt/venv
# Everything the process writes is under /tmp and /var/lib/lakehouse-ingest: mount
# both as emptyDir and the root filesystem can be read-only (Spark scratch, shuffle
# and RocksDB state in spark-local, py4j and JVM temp files in /tmp, HOME for Ivy).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/lakehouse-ingest \
    SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark \
    SPARK_LOCAL_DIRS=/var/lib/lakehouse-ingest/spark-local \
    PYSPARK_PYTHON=/opt/venv/bin/python \
    INGEST_JARS_DIR=/opt/lakehouse-ingest/jars \
    INGEST_SPARK_EXECUTOR_JARS_DIR=/opt/lakehouse-ingest/jars \
    INGEST_STORAGE_ROOT=/var/lib/lakehouse-ingest/lakehouse
WORKDIR /var/lib/lakehouse-ingest
USER 10001:10001
EXPOSE 8080 4040
ENTRYPOINT ["tini", "--", "lakehouse-ingest"]
CMD ["run"]
