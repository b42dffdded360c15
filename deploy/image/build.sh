#!/usr/bin/env bash
# Build the service image from ./Dockerfile without a Docker engine or an image registry.
#
# The Dockerfile's public bases (python:*-slim-bookworm, maven:*-temurin-17) are replaced
# by bases made here from Debian bookworm's own packages with mmdebstrap (python3.11;
# Maven with OpenJDK 17's JDK, which compiles jvm/checker), passed as the build arguments
# PYTHON_IMAGE and MAVEN_IMAGE.
# Every other step is the Dockerfile's own, run by buildah. The root filesystems are
# cached in $LAKEHOUSE_CACHE/image, keyed by their package lists.
#
# When this machine's TLS is intercepted by its own certificate authority, the CA bundle
# and the Java truststore are handed to the build as secrets (pip and Maven read them
# during their steps; no image layer keeps them).
#
#   deploy/image/build.sh [TAG]     (default localhost/lakehouse-ingest:dev)
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."

TAG=${1:-localhost/lakehouse-ingest:dev}
CACHE=${LAKEHOUSE_CACHE:-$HOME/.cache/lakehouse-ingest}/image
MIRRORS=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
mkdir -p "$CACHE"

# base NAME PACKAGES: print the name of a local base image with PACKAGES, making it once.
base() {
  local name=$1 packages=$2 key image tar container
  key=$(printf '%s\n' "$packages" "${MIRRORS[@]}" | sha256sum | cut -c1-12)
  image="localhost/lakehouse-base-$name:bookworm-$key"
  if ! buildah inspect --type image "$image" > /dev/null 2>&1; then
    tar="$CACHE/$name-$key.tar"
    if [ ! -f "$tar" ]; then
      mmdebstrap --quiet --variant=minbase --format=tar --include="$packages" bookworm "$tar.partial" \
        "${MIRRORS[@]}" >&2
      mv "$tar.partial" "$tar"
    fi
    container=$(buildah from --quiet scratch)
    buildah add --quiet "$container" "$tar" / > /dev/null
    buildah commit --quiet --rm "$container" "$image" > /dev/null
  fi
  echo "$image"
}

PYTHON_IMAGE=$(base python "ca-certificates,python3,python3-venv")
MAVEN_IMAGE=$(base maven "ca-certificates,maven,openjdk-17-jdk-headless")

secrets=()
[ -f /etc/ssl/certs/ca-certificates.crt ] &&
  secrets+=(--secret id=build-ca,src=/etc/ssl/certs/ca-certificates.crt)
[ -f /etc/ssl/certs/java/cacerts ] &&
  secrets+=(--secret id=build-truststore,src=/etc/ssl/certs/java/cacerts)

buildah bud --isolation chroot --layers --pull=never --quiet \
  --build-arg "PYTHON_IMAGE=$PYTHON_IMAGE" --build-arg "MAVEN_IMAGE=$MAVEN_IMAGE" \
  "${secrets[@]}" -t "$TAG" .
