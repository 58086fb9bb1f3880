# shellcheck shell=sh disable=SC2034  # sourced: the scripts that source it use these variables
# Sourced by the deploy/*.sh scripts: pick the container engine and the flags it needs here.
#
# ENGINE: docker when its daemon answers (a docker client without a daemon is common), else
# podman. Set ENGINE=docker|podman to choose.
#
# What podman needs on a locked-down machine (found by trying, Debian bookworm's podman 4.3.1
# and runc, running as root inside a VM that may not raise resource limits):
#   --runtime runc       crun (podman's default where installed) fails on setrlimit and cgroups.
#   --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
#                        the default limits podman asks for are above what the host allows:
#                        "error setting rlimit type 7 (nofile) / 6 (nproc): operation not
#                        permitted"; both must be lowered, for `build` and for `run`.
#   --network host       the build reaches PyPI through the host's network (the bridge
#                        network also worked here, host networking needs no port mapping).
#   --format docker      podman's default OCI image format has no HEALTHCHECK field and
#                        drops the Dockerfile's with a warning.
# Docker needs none of these; its builds use BuildKit (the Dockerfile uses RUN --mount).

if [ -z "${ENGINE:-}" ]; then
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
        ENGINE=docker
    elif command -v podman >/dev/null 2>&1; then
        ENGINE=podman
    else
        echo "no container engine: neither a running docker daemon nor podman" >&2
        exit 1
    fi
fi

case "$ENGINE" in
    podman)
        ENGINE_CMD="podman --runtime runc"
        ENGINE_LIMITS="--ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
        ENGINE_BUILD_FLAGS="--format docker --network host $ENGINE_LIMITS"
        ENGINE_RUN_FLAGS="--network host $ENGINE_LIMITS"
        ;;
    docker)
        ENGINE_CMD="docker"
        ENGINE_BUILD_FLAGS=""
        ENGINE_RUN_FLAGS=""
        ;;
    *)
        echo "ENGINE must be docker or podman, not '$ENGINE'" >&2
        exit 1
        ;;
esac
