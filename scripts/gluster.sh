#!/usr/bin/env bash
# A replicated GlusterFS volume on loopback, mounted through FUSE as several "hosts" (docs/cluster.md).
#
# Usage: bash scripts/gluster.sh up|down|status
#
#   up      start glusterd (its own volfile, working/run/log directories under $MQ_GLUSTER_STATE,
#           listening on 127.0.0.2 only), create and start the replica-3 volume "mqvol" on three brick
#           directories (bricks on 127.0.0.2), and mount it $MQ_GLUSTER_HOSTS times (default 3) at
#           $MQ_GLUSTER_STATE/hosts/h1, h2, ... Prints one mount point per line. Idempotent: what is
#           already up is kept.
#   down    unmount every host (and the bind mounts under $MQ_GLUSTER_STATE/roots), stop the volume's
#           processes (glusterfsd bricks, self-heal daemon, FUSE clients) and glusterd, and remove
#           $MQ_GLUSTER_STATE. Idempotent.
#   status  exit 0 if glusterd runs and every host is mounted, 1 otherwise.
#
# Needs root, /dev/fuse and the glusterfs-server and glusterfs-client packages (scripts/test.sh installs
# them under root). Only 127.0.0.2 is used: nothing listens on any other address.
# The volume options are the ones docs/protocol.md section 13 requires (durability) and recommends
# (cross-host visibility); the mount options turn the kernel's attribute and entry caches off.
set -euo pipefail

STATE=${MQ_GLUSTER_STATE:-/tmp/mq-gluster}
HOSTS=${MQ_GLUSTER_HOSTS:-3}
VOL=${MQ_GLUSTER_VOLUME:-mqvol}
ADDR=127.0.0.2
SOCK=$STATE/run/glusterd.socket
MOUNT_OPTS=attribute-timeout=0,entry-timeout=0,negative-timeout=0
# Volume options (docs/protocol.md section 13): see docs/cluster.md for why each is set.
VOLUME_OPTIONS=(
    performance.write-behind off
    performance.flush-behind off
    performance.open-behind off
    performance.quick-read off
    performance.stat-prefetch off
    performance.read-ahead off
    performance.io-cache off
    performance.readdir-ahead off
    performance.nl-cache off
    cluster.ensure-durability on
    cluster.quorum-type auto
    network.ping-timeout 5
)

cli() { gluster --mode=script --glusterd-sock="$SOCK" --log-file="$STATE/log/cli.log" "$@"; }

glusterd_pid() {
    local pid
    pid=$(cat "$STATE/run/glusterd.pid" 2>/dev/null) || return 1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

is_mounted() { grep -qs " $1 fuse.glusterfs " /proc/mounts; }

# Pids of gluster processes that belong to this state directory (bricks, shd, FUSE clients).
our_pids() {
    local pid
    for pid in $(pgrep gluster || true); do
        if tr "\0" " " 2>/dev/null <"/proc/$pid/cmdline" | grep -q -- "$STATE/"; then echo "$pid"; fi
    done
}

up() {
    [[ $(id -u) -eq 0 ]] || { echo "gluster.sh: needs root" >&2; exit 2; }
    [[ -e /dev/fuse ]] || { echo "gluster.sh: no /dev/fuse" >&2; exit 2; }
    command -v glusterd >/dev/null || { echo "gluster.sh: glusterfs-server is not installed" >&2; exit 2; }
    mkdir -p "$STATE"/{work,run,log,bricks,hosts}
    if ! glusterd_pid >/dev/null; then
        cat >"$STATE/glusterd.vol" <<EOF
volume management
    type mgmt/glusterd
    option working-directory $STATE/work
    option run-directory $STATE/run
    option glusterd-sockfile $SOCK
    option transport-type socket
    option transport.socket.bind-address $ADDR
    option transport.socket.listen-port 24007
    option transport.socket.read-fail-log off
    option ping-timeout 0
    option event-threads 1
    option logdir $STATE/log
    option base-port 49152
    option max-port 60999
end-volume
EOF
        glusterd -f "$STATE/glusterd.vol" -p "$STATE/run/glusterd.pid" -l "$STATE/log/glusterd.log" \
            --log-level=WARNING || {
            echo "gluster.sh: glusterd failed to start (another glusterd on $ADDR:24007?); $STATE/log/glusterd.log:" >&2
            tail -5 "$STATE/log/glusterd.log" >&2 || true
            exit 1
        }
        for _ in $(seq 100); do cli volume list >/dev/null 2>&1 && break; sleep 0.1; done
        cli volume list >/dev/null 2>&1 || { echo "gluster.sh: glusterd did not answer" >&2; exit 1; }
    fi
    if ! cli volume info "$VOL" >/dev/null 2>&1; then
        local bricks=()
        for b in 1 2 3; do
            mkdir -p "$STATE/bricks/b$b"
            bricks+=("$ADDR:$STATE/bricks/b$b")
        done
        cli volume create "$VOL" replica 3 "${bricks[@]}" force >/dev/null
        cli volume set "$VOL" "${VOLUME_OPTIONS[@]}" >/dev/null
    fi
    if ! cli volume status "$VOL" >/dev/null 2>&1; then
        cli volume start "$VOL" force >/dev/null
    fi
    local h
    for ((h = 1; h <= HOSTS; h++)); do
        local mp=$STATE/hosts/h$h
        mkdir -p "$mp"
        if ! is_mounted "$mp"; then
            mount -t glusterfs -o "$MOUNT_OPTS,log-file=$STATE/log/h$h.log" "$ADDR:/$VOL" "$mp"
        fi
        echo "$mp"
    done
}

down() {
    local mp pid
    # Bind mounts of the volume's directories under $STATE/roots (tests/cluster/conftest.py, Gluster.roots) go
    # first: rm -rf below must not reach into the volume through one.
    for mp in $(awk -v roots="$STATE/roots/" 'index($2, roots) == 1 {print $2}' /proc/mounts); do
        umount -l "$mp" 2>/dev/null || true
    done
    if [[ -d $STATE/hosts ]]; then
        for mp in "$STATE"/hosts/*; do
            if is_mounted "$mp"; then umount -l "$mp" 2>/dev/null || true; fi
        done
    fi
    # The bricks' and self-heal daemon's sockets in /var/run/gluster (named by hashes): note them while they run.
    local sockets
    sockets=$(for pid in $(our_pids); do
        tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -A1 -x -- -S | grep -v -x -- -S || true
    done)
    if glusterd_pid >/dev/null; then
        cli volume stop "$VOL" force >/dev/null 2>&1 || true
    fi
    for pid in $(our_pids); do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do [[ -z $(our_pids) ]] && break; sleep 0.1; done
    for pid in $(our_pids); do kill -KILL "$pid" 2>/dev/null || true; done
    for sock in $sockets; do rm -f "$sock"; done
    rm -f /var/log/glusterfs/bricks/"$(echo "${STATE#/}" | tr / -)"-bricks-b*.log  # glusterd puts them there
    rm -rf "$STATE"
}

status() {
    glusterd_pid >/dev/null || return 1
    local h
    for ((h = 1; h <= HOSTS; h++)); do is_mounted "$STATE/hosts/h$h" || return 1; done
}

case ${1:-} in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
