#!/bin/sh
# Run the built image against a checkpoint and check it end to end (`make image-test`):
# /health, /ready, /predict, /predict/batch, a non-root server process, the HEALTHCHECK, a
# clean SIGTERM stop. Prints the cold start (container start to the first /ready 200) and the
# image size.
#
#   deploy/image-test.sh CHECKPOINT_DIR        # IMAGE=distrinews-serve ENGINE=... as for build-image.sh
#   deploy/image-test.sh --model-in-image      # an image that holds its model (a Space bundle's)
#
# Needs curl and python3 on the host. The container serves on a free port of the host (so a
# server already on 7860 does not matter) and is removed whatever happens.
set -eu
cd "$(dirname "$0")/.."
# shellcheck source=deploy/container-engine.sh
. deploy/container-engine.sh

IMAGE=${IMAGE:-distrinews-serve}
CHECKPOINT=${1:?usage: deploy/image-test.sh CHECKPOINT_DIR | --model-in-image}
if [ "$CHECKPOINT" = --model-in-image ]; then
    where="its own model"
else
    [ -f "$CHECKPOINT/config.json" ] || { echo "image-test: $CHECKPOINT is not a servable checkpoint directory (no config.json)" >&2; exit 1; }
    CHECKPOINT=$(cd "$CHECKPOINT" && pwd)
    # The server runs as uid 10001: files the host keeps private are unreadable in the container.
    unreadable=$(find "$CHECKPOINT" -type f ! -perm -o+r | head -n 3)
    [ -z "$unreadable" ] || { echo "image-test: not readable by other users (the container's non-root server): $unreadable; chmod -R a+rX $CHECKPOINT" >&2; exit 1; }
    where="$CHECKPOINT mounted read-only at /models/best"
fi
READY_TIMEOUT=${READY_TIMEOUT:-300}

NAME="distrinews-image-test-$$"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
ERRLOG=$(mktemp)
cleanup() { $ENGINE_CMD rm -f "$NAME" >/dev/null 2>&1 || true; rm -f "$ERRLOG"; }
trap cleanup EXIT INT TERM
fail() {
    echo "image-test: FAIL: $*" >&2
    echo "---- container log (last 40 lines, without the /ready polls)" >&2
    $ENGINE_CMD logs "$NAME" 2>&1 | grep -v 'GET /ready' | tail -n 40 >&2 || true
    if [ -s "$ERRLOG" ]; then echo "---- $ENGINE's own stderr" >&2; cat "$ERRLOG" >&2; fi
    exit 1
}
now() { python3 -c 'import time; print(f"{time.monotonic():.3f}")'; }

case "$ENGINE" in
    podman) publish="" ;;                                # host network: PORT is the host's port
    docker) publish="-p 127.0.0.1:$PORT:$PORT" ;;
esac

echo "image-test: $ENGINE run $IMAGE on port $PORT with $where"
t0=$(now)
# Podman without systemd logs "unable to get systemd connection to add healthchecks" here:
# it cannot schedule the HEALTHCHECK on a timer, so it is run on demand below. Its stderr is
# kept (also that of stop and rm, which say the same) and shown only if something fails.
if [ "$CHECKPOINT" = --model-in-image ]; then set --; else set -- -v "$CHECKPOINT:/models/best:ro"; fi
# shellcheck disable=SC2086
$ENGINE_CMD run -d --name "$NAME" $ENGINE_RUN_FLAGS $publish \
    -e PORT="$PORT" "$@" "$IMAGE" >/dev/null 2>"$ERRLOG" \
    || fail "$ENGINE run failed"

# /ready: 503 while the model loads, 200 once it is loaded; a failed load shows in /health.
while :; do
    code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/ready" || true)
    [ "$code" = 200 ] && break
    if [ "$code" = 503 ]; then
        error=$(curl -s "$URL/health" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("error") or "")' 2>/dev/null || true)
        [ -z "$error" ] || fail "the model did not load: $error"
    fi
    running=$($ENGINE_CMD inspect --format '{{.State.Running}}' "$NAME" 2>/dev/null || echo false)
    [ "$running" = true ] || fail "the container exited before /ready answered 200"
    elapsed=$(python3 -c "print(int($(now) - $t0))")
    [ "$elapsed" -lt "$READY_TIMEOUT" ] || fail "/ready not 200 after ${READY_TIMEOUT}s (last: $code)"
    sleep 0.1
done
t_ready=$(now)
cold_start=$(python3 -c "print(f'{$t_ready - $t0:.1f}')")
echo "ok   /ready 200, ${cold_start}s after '$ENGINE run'"

health=$(curl -fsS "$URL/health") || fail "/health did not answer 200"
echo "$health" | python3 -c 'import json, sys; h = json.load(sys.stdin); assert h["status"] == "healthy" and h["model_loaded"] is True, h' \
    || fail "/health: $health"
echo "ok   /health $health"

answer=$(curl -fsS -X POST "$URL/predict" -H 'Content-Type: application/json' \
    -d '{"text": "Oil prices jump after OPEC agrees to cut production"}') || fail "/predict did not answer 200"
echo "$answer" | python3 -c '
import json, sys
a = json.load(sys.stdin)
assert a["label"] in ("World", "Sports", "Business", "Sci/Tech"), a
assert abs(sum(a["probabilities"].values()) - 1) < 1e-3, a' || fail "/predict: $answer"
echo "ok   /predict $answer"

batch=$(curl -fsS -X POST "$URL/predict/batch" -H 'Content-Type: application/json' \
    -d '{"texts": ["Stock market reaches all-time high", "Lakers win championship in overtime thriller"]}') \
    || fail "/predict/batch did not answer 200"
echo "$batch" | python3 -c '
import json, sys
b = json.load(sys.stdin)
assert isinstance(b, list) and len(b) == 2, b
assert all(set(r) == {"label", "label_id", "confidence", "probabilities"} for r in b), b' || fail "/predict/batch: $batch"
echo "ok   /predict/batch $(echo "$batch" | python3 -c 'import json, sys; print([r["label"] for r in json.load(sys.stdin)])')"

# Non-root: the image's USER and the uid of the server process (PID 1, exec-form CMD).
user=$($ENGINE_CMD inspect --format '{{.Config.User}}' "$NAME")
uid=$($ENGINE_CMD exec "$NAME" stat -c %u /proc/1)                 # /proc/PID belongs to its euid
cmdline=$($ENGINE_CMD exec "$NAME" sh -c 'tr "\0" " " </proc/1/cmdline')
case "$user" in ""|root|0|0:*|root:*) fail "image USER is '$user'" ;; esac
[ "$uid" != 0 ] || fail "the server process runs as root"
echo "ok   non-root: USER $user, PID 1 uid $uid: $cmdline"

# HEALTHCHECK: podman runs it on demand; docker on its own timer (interval 30s), so wait.
case "$ENGINE" in
    podman)
        $ENGINE_CMD healthcheck run "$NAME" >/dev/null 2>>"$ERRLOG" || fail "HEALTHCHECK did not pass"
        ;;
    docker)
        status=""
        for _ in $(seq 1 90); do
            status=$(docker inspect --format '{{.State.Health.Status}}' "$NAME")
            [ "$status" = healthy ] && break
            sleep 1
        done
        [ "$status" = healthy ] || fail "HEALTHCHECK status '$status' after 90s"
        ;;
esac
echo "ok   HEALTHCHECK passes"

# SIGTERM: the server drains and exits 0.
$ENGINE_CMD stop -t 30 "$NAME" >/dev/null 2>>"$ERRLOG"
code=$($ENGINE_CMD inspect --format '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || fail "exit code $code after SIGTERM (want 0)"
echo "ok   stopped by SIGTERM, exit code 0"
$ENGINE_CMD rm "$NAME" >/dev/null 2>>"$ERRLOG"
echo "ok   removed"

size=$($ENGINE_CMD image inspect --format '{{.Size}}' "$IMAGE")
echo "image-test: PASS  image $IMAGE $(python3 -c "print(f'{$size / 1e6:.0f} MB')")  cold start ${cold_start}s"
