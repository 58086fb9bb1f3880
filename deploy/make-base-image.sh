#!/bin/sh
# Build a Debian bookworm base image from Debian's package archive, for machines where no
# container registry is reachable (so `FROM python:3.11.11-slim-bookworm` cannot be pulled) but the
# Debian archive is. `make image` calls this only when BASE_IMAGE is this local tag and
# the engine does not have it yet; with a registry, build with BASE_IMAGE=python:3.11.11-slim-bookworm
# and this script is never needed.
#
#   deploy/make-base-image.sh [TAG]          # default TAG: distrinews-base:bookworm
#   ENGINE=podman MIRROR=http://deb.debian.org/debian deploy/make-base-image.sh
#
# What the image holds: `debootstrap --variant=minbase` (Essential packages + apt) plus
# python3, python3-venv (the Dockerfile makes /opt/venv with whatever python3 the base
# has: Debian bookworm's is 3.11, the same minor version as python:3.11-slim and the
# cp311 torch wheel) and ca-certificates. Documentation, man pages, locales and apt's
# caches are removed, and dpkg is told to keep leaving them out, as the official
# debian:*-slim images do. It is bookworm at the archive's current point release; it does
# not pull bookworm-security by itself (rebuild the base to pick up updates).
#
# Needs root (debootstrap chroots and creates device nodes) and the `debootstrap` package.
set -eu

TAG=${1:-distrinews-base:bookworm}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
INCLUDE=${INCLUDE:-python3,python3-venv,ca-certificates}

# shellcheck source=deploy/container-engine.sh
. "$(dirname "$0")/container-engine.sh"
command -v debootstrap >/dev/null 2>&1 || {
    echo "make-base-image: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "make-base-image: debootstrap needs root" >&2; exit 1; }

ROOTFS=$(mktemp -d "${TMPDIR:-/tmp}/distrinews-base.XXXXXX")
trap 'rm -rf "$ROOTFS" "$ROOTFS.log"' EXIT INT TERM

echo "make-base-image: debootstrap --variant=minbase --include=$INCLUDE $SUITE ($MIRROR)"
debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
    tail -n 20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; exit 1; }
rm -f "$ROOTFS.log"

# Slim it the way debian:*-slim does, and keep later `apt-get install`s slim too.
cat >"$ROOTFS/etc/dpkg/dpkg.cfg.d/docker-slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
find "$ROOTFS/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$ROOTFS/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$ROOTFS/usr/share/man"/* "$ROOTFS/usr/share/info"/* "$ROOTFS/usr/share/locale"/* \
       "$ROOTFS/usr/share/lintian"/* \
       "$ROOTFS/var/cache/apt"/*.bin "$ROOTFS/var/cache/apt/archives"/*.deb \
       "$ROOTFS/var/lib/apt/lists"/* "$ROOTFS/var/log"/*.log "$ROOTFS/tmp"/*

echo "make-base-image: importing as $TAG with $ENGINE"
tar --numeric-owner -C "$ROOTFS" -c . | $ENGINE_CMD import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV LANG=C.UTF-8' \
    - "$TAG" >/dev/null
$ENGINE_CMD image ls "$TAG"
