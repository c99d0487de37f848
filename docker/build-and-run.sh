#!/usr/bin/env bash
# Build both images and run them as docs/operators.md ("Containers") says, then check
# from the host: the daemon container's FUSE mount reaches the host through an rshared
# bind mount of the mountpoint's parent directory (/mnt in the docs), a trainer container
# binds the same parent (rslave), reads and writes the mount as uid 10001 and uploads a
# LightGBM policy; the daemon container is replaced while the trainer runs and the
# trainer reattaches to the new mount; `podman stop` of the daemon seals and unmounts
# (on the host too).  Then the units of systemd/ under a real systemd in a container
# (docker/Dockerfile.systemd): active, policy uploaded, restart, clean shutdown.
#
#   bash docker/build-and-run.sh            (from anywhere; root, podman, runc, debootstrap)
#
# Needs: root, /dev/fuse, `apt-get install podman runc debootstrap`, the Debian mirror
# and PyPI.  No registry is used: the base image is a debootstrapped minbase bookworm,
# cached as a tarball in $MLFS_CI_CACHE (default /var/cache/mlfs-ci) and imported as
# $MLFS_CI_BASE (default localhost/debian:bookworm-slim).  Safe to run again: it removes
# every container, mount and directory it made, also on failure or Ctrl-C.
#
# Environment:
#   MLFS_CI_CACHE      cache directory (base tarball, containers.conf)   /var/cache/mlfs-ci
#   MLFS_CI_MIRROR     Debian mirror for debootstrap                     http://deb.debian.org/debian
#   MLFS_CI_BASE       base image name                                   localhost/debian:bookworm-slim
#   MLFS_CI_TAG        tag of the built images (localhost/mlfs, localhost/mlfs-trainer,
#                      localhost/mlfs-systemd)                           ci
#   MLFS_CI_KEEP_IMAGES=1  keep the built images (and their layer cache) afterwards;
#                      default: remove them (the base image and the tarball are kept)
#   MLFS_CI_TRAIN_SECONDS  longest wait for the trainer's first policy    120
#   MLFS_CI_RUN_SECONDS    how long the trainer runs before the daemon is replaced  30
#   MLFS_CI_CA         a CA bundle for TLS inside the build (pip -> PyPI through an
#                      intercepting proxy); default: the host's bundle when the host's
#                      pip is configured with one (PIP_CERT or `pip config`), else none
#   MLFS_CI_CONTEXT    the source tree to build the images from          the repository
#   MLFS_CI_SYSTEMD=0  skip running systemd/ units under a real systemd in a container
#                      (docker/Dockerfile.systemd; podman --systemd=always)
#   CONTAINERS_CONF    default: $MLFS_CI_CACHE/containers.conf (runc, lowered ulimits)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONTEXT=${MLFS_CI_CONTEXT:-$ROOT}
CACHE=${MLFS_CI_CACHE:-/var/cache/mlfs-ci}
MIRROR=${MLFS_CI_MIRROR:-http://deb.debian.org/debian}
BASE=${MLFS_CI_BASE:-localhost/debian:bookworm-slim}
TAG=${MLFS_CI_TAG:-ci}
IMG_DAEMON=localhost/mlfs:$TAG
IMG_TRAINER=localhost/mlfs-trainer:$TAG
TRAIN_SECONDS=${MLFS_CI_TRAIN_SECONDS:-120}
RUN_SECONDS=${MLFS_CI_RUN_SECONDS:-30}
TARBALL=$CACHE/bookworm-minbase.tar

T0=$(date +%s)
say() { printf '[%4ds] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { say "FAIL: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || { echo "build-and-run.sh: needs root" >&2; exit 2; }
[ -c /dev/fuse ] || { echo "build-and-run.sh: no /dev/fuse" >&2; exit 2; }
for tool in podman runc debootstrap; do
    command -v "$tool" >/dev/null || {
        echo "build-and-run.sh: no $tool (apt-get install podman runc debootstrap)" >&2
        exit 2
    }
done

mkdir -p "$CACHE"
# runc, not crun; the VM's nofile/nproc limits are below podman's defaults (1048576)
if [ -z "${CONTAINERS_CONF:-}" ]; then
    export CONTAINERS_CONF=$CACHE/containers.conf
    cat >"$CONTAINERS_CONF.tmp" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
EOF
    mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"
fi

# ---------------------------------------------------------------- state and cleanup
WORK=$(mktemp -d /tmp/mlfs-containers.XXXXXX)
HOSTDIR=$WORK/mnt          # /mnt in the docs: bound at /mnt in both containers
MOUNT=$HOSTDIR/mlfs        # /mnt/mlfs: where the host sees the exchange
STATE=$WORK/state          # the daemon's /var/lib/mlfs
CONTAINERS=()              # container ids, stopped and removed at exit
BOUND=0

# the file system type mounted at $MOUNT on the host (empty: none)
fstype() { findmnt -n -o FSTYPE --mountpoint "$MOUNT" 2>/dev/null | tail -1; }
# podman without systemd on the host cannot set up healthcheck timers: drop that noise
quiet() { "$@" 2> >(grep -v 'unable to get systemd connection' >&2); }

cleanup() {
    local rc=$?
    set +e
    for cid in "${CONTAINERS[@]}"; do
        [ -n "$cid" ] || continue
        podman stop -t 90 "$cid" >/dev/null 2>&1
        podman rm -f -v "$cid" >/dev/null 2>&1
    done
    # a stale FUSE mount (daemon killed), then the shared self-bind of HOSTDIR
    while mountpoint -q "$MOUNT" 2>/dev/null || [ -n "$(fstype)" ]; do
        say "cleanup: unmounting a left-over mount at $MOUNT"
        umount "$MOUNT" 2>/dev/null || umount -l "$MOUNT" || break
    done
    [ "$BOUND" = 1 ] && mountpoint -q "$HOSTDIR" && umount -l "$HOSTDIR"
    if [ "${MLFS_CI_KEEP_IMAGES:-0}" != 1 ]; then
        podman rmi -f "$IMG_DAEMON" "$IMG_TRAINER" "localhost/mlfs-systemd:$TAG" \
            >/dev/null 2>&1
        podman image prune -f >/dev/null 2>&1   # dangling build stages
    fi
    rm -rf "$WORK"
    if [ "$rc" -eq 0 ]; then say "OK"; else say "FAILED (exit $rc)"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- the base image
if ! podman image exists "$BASE"; then
    if [ ! -s "$TARBALL" ]; then
        say "debootstrap --variant=minbase bookworm ($MIRROR) -> $TARBALL"
        rootfs=$CACHE/rootfs.tmp
        rm -rf "$rootfs"
        debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
            || { tail -20 "$CACHE/debootstrap.log"; die "debootstrap"; }
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar --numeric-owner -C "$rootfs" -cf "$TARBALL.tmp" .
        mv "$TARBALL.tmp" "$TARBALL"
        rm -rf "$rootfs"
    fi
    say "podman import $TARBALL $BASE"
    podman import --change 'CMD ["/bin/bash"]' "$TARBALL" "$BASE" >/dev/null
fi

# ---------------------------------------------------------------- the two images
# TLS interception: hand the build a CA bundle through a build-time bind mount (never
# stored in a layer) and a pip configuration naming it.
# --format docker: the OCI format drops HEALTHCHECK
BUILD_OPTS=(--format docker --network host --build-arg "BASE=$BASE")
CA=${MLFS_CI_CA:-${PIP_CERT:-}}
if [ -z "$CA" ] && [ -x "$ROOT/.venv/bin/pip" ]; then
    CA=$("$ROOT/.venv/bin/pip" config get global.cert 2>/dev/null || true)
fi
if [ -n "$CA" ] && [ -s "$CA" ]; then
    printf '[global]\ncert = /run/mlfs-build-ca.crt\n' >"$WORK/pip.conf"
    BUILD_OPTS+=(-v "$CA:/run/mlfs-build-ca.crt:ro" -v "$WORK/pip.conf:/etc/pip.conf:ro")
    say "build: pip trusts $CA"
fi
say "podman build $IMG_DAEMON"
podman build -q "${BUILD_OPTS[@]}" -f "$CONTEXT/docker/Dockerfile" -t "$IMG_DAEMON" "$CONTEXT" \
    >/dev/null
say "podman build $IMG_TRAINER"
podman build -q "${BUILD_OPTS[@]}" -f "$CONTEXT/docker/Dockerfile.trainer" -t "$IMG_TRAINER" \
    "$CONTEXT" >/dev/null

# ---------------------------------------------------------------- the daemon container
mkdir -p "$MOUNT" "$STATE"
# rshared needs the host directory on a shared mount: make it one (a bind of itself)
# when it is not (this VM's / is private; systemd hosts are shared)
if [ "$(findmnt -n -o PROPAGATION --target "$HOSTDIR")" != shared ]; then
    mount --bind "$HOSTDIR" "$HOSTDIR"
    BOUND=1
    mount --make-shared "$HOSTDIR"
fi
DAEMON=
start_daemon() {
    say "podman run $IMG_DAEMON (host $HOSTDIR at /mnt, rshared)"
    DAEMON=$(quiet podman run -d --init --device /dev/fuse --cap-add SYS_ADMIN \
        --security-opt apparmor=unconfined \
        --mount "type=bind,src=$HOSTDIR,dst=/mnt,bind-propagation=rshared" \
        -v "$STATE:/var/lib/mlfs" -v "$ROOT/docker/mlfs.toml:/etc/mlfs/mlfs.toml:ro" \
        --stop-timeout 90 "$IMG_DAEMON" --config /etc/mlfs/mlfs.toml)
    CONTAINERS+=("$DAEMON")
    for _ in $(seq 300); do
        [ -e "$MOUNT/version" ] && break
        [ "$(podman inspect -f '{{.State.Running}}' "$DAEMON")" = true ] \
            || { podman logs "$DAEMON" | tail -30; die "daemon container exited"; }
        sleep 0.1
    done
    [ -e "$MOUNT/version" ] || { podman logs "$DAEMON" | tail -30; die "no mount on the host"; }
    findmnt -n -o TARGET,FSTYPE,OPTIONS --mountpoint "$MOUNT" | tail -1 | sed 's/^/    /'
    [ "$(fstype)" = fuse.mlfs ] || die "$MOUNT is not a fuse.mlfs mount on the host"
    ls "$MOUNT/sim.readahead" >/dev/null || die "ls $MOUNT/sim.readahead"
    # shellcheck disable=SC2012  # a listing to show, not to parse
    say "host sees the mount: $(tr -d '\n' <"$MOUNT/version"); ls sim.readahead:" \
        "$(ls "$MOUNT/sim.readahead" | tr '\n' ' ')"
    quiet podman healthcheck run "$DAEMON" >/dev/null || die "daemon healthcheck"
    say "daemon healthcheck (the image's HEALTHCHECK): healthy"
}
stop_daemon() {
    say "podman stop daemon (SIGTERM: seal, restore, unmount)"
    quiet podman stop -t 90 "$DAEMON" >/dev/null
    local code
    code=$(podman inspect -f '{{.State.ExitCode}}' "$DAEMON")
    [ "$code" = 0 ] || { podman logs "$DAEMON" | tail -30; die "daemon exit status $code"; }
    [ -z "$(fstype)" ] || die "the mount is still on the host after podman stop ($(fstype))"
    [ ! -e "$STATE/mlfs.pid" ] || die "mlfs.pid left behind (not a clean stop)"
    ls "$STATE"/sim.readahead/dataset/*.parquet >/dev/null 2>&1 || die "no sealed portion"
    local w
    for w in "$STATE"/sim.readahead/dataset/wal.*.jsonl; do
        [ ! -s "$w" ] || die "unsealed rows left in $w"
    done
    say "daemon exit 0, unmounted on the host, $(find "$STATE/sim.readahead/dataset" \
        -name '*.parquet' | wc -l) sealed portions, no write-ahead rows left"
    quiet podman rm -v "$DAEMON" >/dev/null
    CONTAINERS=("${CONTAINERS[@]/$DAEMON}")
}
start_daemon

# ---------------------------------------------------------------- the trainer container
say "podman run $IMG_TRAINER (same host dir at /mnt, rslave, uid 10001)"
TRAINER=$(podman run -d --init \
    --mount "type=bind,src=$HOSTDIR,dst=/mnt,bind-propagation=rslave" \
    --stop-timeout 30 "$IMG_TRAINER" /mnt/mlfs sim.readahead --model lgbm)
CONTAINERS+=("$TRAINER")
TRAINER_T0=$(date +%s)
MODEL=$MOUNT/sim.readahead/models/lgbm
trainer_alive() {
    [ "$(podman inspect -f '{{.State.Running}}' "$TRAINER")" = true ] \
        || { podman logs "$TRAINER" | tail -30; die "trainer container exited"; }
}
policy_ok() { [ -s "$MODEL/policy" ] && [ -s "$STATE/sim.readahead/models/lgbm/policy.txt" ]; }
deadline=$(( $(date +%s) + TRAIN_SECONDS ))
until policy_ok; do
    trainer_alive
    [ "$(date +%s)" -lt "$deadline" ] \
        || { podman logs "$TRAINER" | tail -30; die "no policy after ${TRAIN_SECONDS}s"; }
    sleep 1
done
say "from the host: $MODEL exists; policy $(wc -c <"$MODEL/policy") bytes through" \
    "the mount, $(wc -c <"$STATE/sim.readahead/models/lgbm/policy.txt") in the state dir"
# about RUN_SECONDS of training in all: fits, feedback, recommendations
while [ $(( $(date +%s) - TRAINER_T0 )) -lt "$RUN_SECONDS" ]; do trainer_alive; sleep 1; done
say "model: mode $(cat "$MODEL/mode" 2>/dev/null || echo '?'), state" \
    "$(cat "$MODEL/state" 2>/dev/null || echo '?')"
grep -E '^mlfs_(recommendations_total|ticks_total)' "$MOUNT/metrics" | sed 's/^/    /' || true

# ---------------------------------------------------------------- replace the daemon
# the trainer keeps running: the new mount reaches it through its rslave bind of /mnt
stop_daemon
start_daemon
deadline=$(( $(date +%s) + 60 ))
until [ "$(podman logs "$TRAINER" 2>&1 | grep -c 'attached to')" -ge 2 ]; do
    trainer_alive
    [ "$(date +%s)" -lt "$deadline" ] \
        || { podman logs "$TRAINER" | tail -30; die "trainer did not reattach"; }
    sleep 1
done
podman exec "$TRAINER" test -e /mnt/mlfs/version || die "trainer does not see the new mount"
say "trainer reattached to the new mount; policy reloaded by the daemon:" \
    "$(wc -c <"$MODEL/policy") bytes"

# ---------------------------------------------------------------- stop: trainer, daemon
say "podman stop trainer"
podman stop -t 30 "$TRAINER" >/dev/null
[ "$(podman inspect -f '{{.State.ExitCode}}' "$TRAINER")" = 0 ] || die "trainer exit status"
podman logs "$TRAINER" 2>&1 | grep -E 'trainer done' | sed 's/^/    /' \
    || die "trainer did not end cleanly"
podman rm -v "$TRAINER" >/dev/null
CONTAINERS=("${CONTAINERS[@]/$TRAINER}")
stop_daemon
for cid in "${CONTAINERS[@]}"; do [ -z "$cid" ] || die "container $cid left over"; done
CONTAINERS=()

# ---------------------------------------------------------------- systemd in a container
# docker/Dockerfile.systemd: the daemon image plus systemd as PID 1 running the units of
# systemd/ unchanged (mlfs@mnt-mlfs, mlfs-train@sim.readahead as user mlfs).
if [ "${MLFS_CI_SYSTEMD:-1}" = 1 ]; then
    IMG_SYSTEMD=localhost/mlfs-systemd:$TAG
    say "podman build $IMG_SYSTEMD"
    podman build -q "${BUILD_OPTS[@]}" --build-arg "IMAGE=$IMG_DAEMON" \
        -f "$CONTEXT/docker/Dockerfile.systemd" -t "$IMG_SYSTEMD" "$CONTEXT" >/dev/null
    SDSTATE=$WORK/systemd-state
    mkdir -p "$SDSTATE"
    say "podman run --systemd=always $IMG_SYSTEMD (host $HOSTDIR at /mnt, rshared)"
    SYSTEMD_C=$(quiet podman run -d --systemd=always --device /dev/fuse --cap-add SYS_ADMIN \
        --security-opt apparmor=unconfined \
        --mount "type=bind,src=$HOSTDIR,dst=/mnt,bind-propagation=rshared" \
        -v "$SDSTATE:/var/lib/mlfs" --stop-timeout 120 "$IMG_SYSTEMD")
    CONTAINERS+=("$SYSTEMD_C")
    UNITS=(mlfs@mnt-mlfs.service mlfs-train@sim.readahead.service)
    sdexec() { podman exec "$SYSTEMD_C" "$@"; }
    sdfail() {
        sdexec systemctl --no-pager status "${UNITS[@]}" 2>&1 | tail -40
        die "$*"
    }
    deadline=$(( $(date +%s) + 60 ))
    until [ "$(sdexec systemctl is-system-running 2>/dev/null)" = running ] \
        && [ -e "$MOUNT/version" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || sdfail "systemd: not running with the mount"
        sleep 1
    done
    sdexec systemctl is-active --quiet "${UNITS[@]}" || sdfail "units not active"
    [ "$(fstype)" = fuse.mlfs ] || sdfail "the unit's mount did not reach the host"
    say "systemd running; ${UNITS[*]} active; host sees $(tr -d '\n' <"$MOUNT/version")"
    # Type=notify: active only after the daemon's READY=1, whose STATUS= systemd shows
    [ "$(sdexec systemctl show -P Type mlfs@mnt-mlfs.service)" = notify ] \
        || sdfail "mlfs@ is not Type=notify"
    sdstatus=$(sdexec systemctl show -P StatusText mlfs@mnt-mlfs.service)
    [ "$sdstatus" = "serving 1 subsystem(s)" ] || sdfail "no READY=1/STATUS= (got '$sdstatus')"
    sdexec journalctl -q -o cat -u mlfs@mnt-mlfs.service | grep -q 'serving (pid' \
        || sdfail "the daemon's log is not in the journal"
    [ ! -e "$SDSTATE/mnt-mlfs/mlfs.log" ] || sdfail "logged twice: journal and mlfs.log"
    say "Type=notify: READY=1 received (status: $sdstatus); logs in the journal only"
    SDPOLICY=$SDSTATE/mnt-mlfs/sim.readahead/models/lgbm/policy.txt
    deadline=$(( $(date +%s) + TRAIN_SECONDS ))
    until [ -s "$MODEL/policy" ] && [ -s "$SDPOLICY" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || sdfail "no policy from mlfs-train@"
        sleep 1
    done
    say "mlfs-train@ (user mlfs, namespaced) uploaded a policy: $(wc -c <"$MODEL/policy") bytes"
    # a restart of the mount unit under the running trainer unit
    sdexec systemctl restart mlfs@mnt-mlfs.service || sdfail "systemctl restart"
    deadline=$(( $(date +%s) + 60 ))
    until [ "$(sdexec journalctl -q -o cat -u mlfs-train@sim.readahead.service \
            | grep -c 'attached to')" -ge 2 ]; do
        [ "$(date +%s)" -lt "$deadline" ] || sdfail "trainer unit did not reattach"
        sleep 1
    done
    [ "$(fstype)" = fuse.mlfs ] || sdfail "no mount on the host after the restart"
    sdexec journalctl -q -o cat -u mlfs@mnt-mlfs.service | grep -q 'sealing and unmounting' \
        || sdfail "no clean stop (STOPPING=1, sealing) in the journal at the restart"
    say "systemctl restart mlfs@mnt-mlfs: remounted, the trainer unit reattached"
    # podman stop: SIGRTMIN+3, systemd stops the trainer, then the mount (seal, unmount)
    say "podman stop (systemd shutdown)"
    quiet podman stop -t 120 "$SYSTEMD_C" >/dev/null
    code=$(podman inspect -f '{{.State.ExitCode}}' "$SYSTEMD_C")
    [ "$code" = 0 ] || die "systemd container exit status $code"
    [ -z "$(fstype)" ] || die "the mount is still on the host after the systemd shutdown"
    [ ! -e "$SDSTATE/mnt-mlfs/mlfs.pid" ] || die "mlfs.pid left behind by the unit"
    for w in "$SDSTATE"/mnt-mlfs/sim.readahead/dataset/wal.*.jsonl; do
        [ ! -s "$w" ] || die "unsealed rows left in $w"
    done
    [ ! -e "$SDSTATE/mnt-mlfs/mlfs.log" ] || die "the unit wrote mlfs.log besides the journal"
    say "systemd shutdown: exit 0, unmounted on the host, rows sealed"
    quiet podman rm -v "$SYSTEMD_C" >/dev/null
    CONTAINERS=()
fi
