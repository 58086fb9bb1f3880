#!/bin/sh
# Build deploy/Dockerfile with docker or podman (`make image` runs this from the repo root).
#
#   IMAGE=distrinews-serve BASE_IMAGE=python:3.11.11-slim-bookworm deploy/build-image.sh   # with a registry
#   deploy/build-image.sh                  # no registry: a local Debian base (made if missing)
#   CONTEXT=DIR DOCKERFILE=DIR/Dockerfile IMAGE=... deploy/build-image.sh       # a Space bundle (make space-image-test)
#
# Environment: IMAGE (tag to build), BASE_IMAGE, LOCAL_BASE (the tag make-base-image.sh
# makes), TORCH_VERSION, ENGINE (docker|podman), PIP_CERT (a CA bundle pip should trust
# during the build; default: the system bundle, which is where a TLS-intercepting proxy's CA
# is installed on the host but not in the image), CONTEXT and DOCKERFILE (default: the repo
# root and deploy/Dockerfile). The torch wheel is staged into CONTEXT/.whl only for a
# Dockerfile that installs torch.
set -eu
cd "$(dirname "$0")/.."
# shellcheck source=deploy/container-engine.sh
. deploy/container-engine.sh

IMAGE=${IMAGE:-distrinews-serve}
LOCAL_BASE=${LOCAL_BASE:-distrinews-base:bookworm}
BASE_IMAGE=${BASE_IMAGE:-$LOCAL_BASE}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
PIP_CERT=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
CONTEXT=${CONTEXT:-.}
DOCKERFILE=${DOCKERFILE:-deploy/Dockerfile}

# 1. The base: only the local Debian one is ever made here; a registry image is pulled by
#    the build itself.
if [ "$BASE_IMAGE" = "$LOCAL_BASE" ] && ! $ENGINE_CMD image inspect "$LOCAL_BASE" >/dev/null 2>&1; then
    echo "build-image: no $LOCAL_BASE yet, making it from the Debian archive (a few minutes)"
    deploy/make-base-image.sh "$LOCAL_BASE"
fi

# 2. The CPU torch wheel into the build context (.whl/, git-ignored), from wherever the host's
#    pip finds it: its own configuration first (here a local find-links directory), then the
#    PyTorch CPU index. If both fail, the build falls back to the PyTorch CPU index itself.
if grep -q 'TORCH_VERSION' "$DOCKERFILE"; then
    mkdir -p "$CONTEXT/.whl"
    if ! ls "$CONTEXT"/.whl/torch-"$TORCH_VERSION"+cpu-cp311-*.whl >/dev/null 2>&1; then
        set -- python3 -m pip download --quiet --no-deps --dest "$CONTEXT/.whl" \
            --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
            "torch==$TORCH_VERSION+cpu"
        "$@" 2>/dev/null || "$@" --extra-index-url https://download.pytorch.org/whl/cpu \
            || echo "build-image: no local torch $TORCH_VERSION+cpu wheel; the build will use the PyTorch CPU index"
    fi
fi

# 3. The image.
secret=""
if [ -s "$PIP_CERT" ]; then secret="--secret id=pip_cert,src=$PIP_CERT"; fi
torch_arg=""
if grep -q 'TORCH_VERSION' "$DOCKERFILE"; then torch_arg="--build-arg TORCH_VERSION=$TORCH_VERSION"; fi
echo "build-image: $ENGINE build $IMAGE from $BASE_IMAGE ($DOCKERFILE${torch_arg:+, torch $TORCH_VERSION+cpu})"
start=$(date +%s)
# shellcheck disable=SC2086  # the flag lists are meant to split
$ENGINE_CMD build $ENGINE_BUILD_FLAGS $secret $torch_arg \
    --build-arg BASE_IMAGE="$BASE_IMAGE" \
    -f "$DOCKERFILE" -t "$IMAGE" "$CONTEXT"
echo "build-image: built $IMAGE in $(( $(date +%s) - start ))s"
$ENGINE_CMD image ls "$IMAGE"
