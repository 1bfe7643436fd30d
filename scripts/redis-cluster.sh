#!/usr/bin/env bash
# A throwaway local Redis Cluster for the tests: three masters and three replicas of Debian's
# `redis-server` on 127.0.0.1, ports PULSE_CLUSTER_BASE_PORT (default 7000) to base+5, one
# directory per node under DIR (default /tmp/pulse-redis-cluster). Nothing is persisted.
#
#   bash scripts/redis-cluster.sh start [DIR]    # idempotent: a healthy cluster is left alone
#   bash scripts/redis-cluster.sh status [DIR]   # exit status 0 when every node is healthy
#   bash scripts/redis-cluster.sh stop [DIR]
#
# `start` ends by printing the URL Pulse takes for it (seeds are the three first ports):
#   redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
set -euo pipefail

BASE_PORT="${PULSE_CLUSTER_BASE_PORT:-7000}"
if ! [[ $BASE_PORT =~ ^[0-9]+$ ]] || ((BASE_PORT < 1 || BASE_PORT > 65530)); then
    echo "redis-cluster: PULSE_CLUSTER_BASE_PORT=$BASE_PORT is not a port (up to 65530)" >&2
    exit 2
fi
# Replicas take a few seconds to sync and gossip to converge; a loaded CI machine needs more.
READY_TIMEOUT="${PULSE_CLUSTER_TIMEOUT:-60}"
HOST=127.0.0.1
PORTS=()
for i in 0 1 2 3 4 5; do
    PORTS+=($((BASE_PORT + i)))
done

usage() {
    echo "usage: bash scripts/redis-cluster.sh start|stop|status [DIR]" >&2
    exit 2
}

die() {
    echo "redis-cluster: $*" >&2
    exit 1
}

have() {
    command -v "$1" >/dev/null 2>&1
}

url() {
    echo "redis+cluster://$HOST:${PORTS[0]},$HOST:${PORTS[1]},$HOST:${PORTS[2]}"
}

# Bounded, so a wedged node cannot hang CI.
cli() {
    local port=$1
    shift
    timeout 5 redis-cli -h "$HOST" -p "$port" "$@" 2>/dev/null
}

# Whether anything accepts TCP connections on the port, Redis or not.
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

# Value of NAME in an INFO-style reply (its lines end in \r\n).
field() {
    local name=$1 text=$2 line
    while IFS= read -r line; do
        line=${line%$'\r'}
        if [[ $line == "$name:"* ]]; then
            echo "${line#*:}"
            return 0
        fi
    done <<<"$text"
    return 1
}

cluster_ok_on() {
    [[ $(field cluster_state "$(cli "$1" cluster info)") == ok ]]
}

# A live process that really is a redis-server: pidfiles outlive crashes, and pids get reused.
# A zombie counts as gone: the daemonized node is init's child, and some inits (containers') take
# seconds to reap it.
redis_pid_alive() {
    local pid=$1 stat
    [[ $pid =~ ^[0-9]+$ ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == redis-server* ]] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

pid_of() {
    local file=$1/redis.pid
    [[ -f $file ]] && cat "$file" 2>/dev/null
    return 0
}

# Stops every node DIR holds, whatever base port it was started with. A server on the node's port
# is only shut down when its working directory is that node's: someone else's Redis survives.
stop_nodes() {
    local dir=$1 node port pid waited
    [[ -d $dir ]] || return 0
    for node in "$dir"/[0-9]*/; do
        [[ -d $node ]] || continue
        node=${node%/}
        port=${node##*/}
        pid=$(pid_of "$node")
        if [[ $(cli "$port" config get dir | sed -n 2p) == "$node" ]]; then
            cli "$port" shutdown nosave >/dev/null || true
        fi
        # SHUTDOWN returns before the process is gone; a node that ignored it is killed.
        waited=0
        while redis_pid_alive "$pid" && ((waited < 20)); do
            ((waited == 10)) && kill -TERM "$pid" 2>/dev/null
            sleep 0.5
            waited=$((waited + 1))
        done
        if redis_pid_alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null || true
            echo "killed node $port (pid $pid): it ignored SHUTDOWN and SIGTERM"
        fi
    done
}

# Every node has the whole cluster in view and every master a replica in sync: only then do
# clients see a stable MOVED-free topology and replica reads work.
cluster_ready() {
    local port info replicas masters=0
    for port in "${PORTS[@]}"; do
        info=$(cli "$port" cluster info) || return 1
        [[ $(field cluster_state "$info") == ok ]] || return 1
        [[ $(field cluster_known_nodes "$info") == 6 ]] || return 1
        info=$(cli "$port" info replication) || return 1
        case $(field role "$info") in
            master)
                masters=$((masters + 1))
                replicas=$(field connected_slaves "$info") || return 1
                ((replicas >= 1)) || return 1
                ;;
            slave)
                [[ $(field master_link_status "$info") == up ]] || return 1
                ;;
            *) return 1 ;;
        esac
    done
    ((masters == 3))
}

start() {
    local dir=$1 port node deadline
    { have redis-server && have redis-cli; } || die "redis-server and redis-cli are needed (apt-get install redis-server)"
    if cluster_ok_on "${PORTS[0]}"; then
        echo "a Redis Cluster already answers on $HOST:${PORTS[0]} (cluster_state:ok): left as it is"
        url
        return 0
    fi

    stop_nodes "$dir"
    # Only the node directories are wiped, not DIR itself: a mistyped DIR must not cost anything.
    for port in "${PORTS[@]}"; do
        rm -rf -- "${dir:?}/$port"
    done
    # With --daemonize the parent exits 0 before binding, so a busy port would go unnoticed and the
    # PING below would reach whatever holds it.
    for port in "${PORTS[@]}"; do
        port_open "$port" && die "port $port is taken by something that is not a node of $dir; free ports ${PORTS[0]}-${PORTS[5]} or set PULSE_CLUSTER_BASE_PORT"
    done

    for port in "${PORTS[@]}"; do
        node=$dir/$port
        mkdir -p "$node"
        redis-server --port "$port" --bind "$HOST" --dir "$node" \
            --logfile "$node/redis.log" --pidfile "$node/redis.pid" --daemonize yes \
            --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
            --cluster-allow-reads-when-down no --save "" --appendonly no ||
            die "redis-server did not start on port $port; see $node/redis.log"
    done

    deadline=$((SECONDS + 15))
    for port in "${PORTS[@]}"; do
        until [[ $(cli "$port" ping) == PONG ]]; do
            ((SECONDS < deadline)) || die "node $port does not answer PING; see $dir/$port/redis.log"
            sleep 0.2
        done
    done

    local seeds=()
    for port in "${PORTS[@]}"; do
        seeds+=("$HOST:$port")
    done
    # Its output is long and only matters when it fails.
    timeout 120 redis-cli --cluster create "${seeds[@]}" --cluster-replicas 1 --cluster-yes \
        >"$dir/cluster-create.log" 2>&1 ||
        { cat "$dir/cluster-create.log" >&2; die "redis-cli --cluster create failed (log above)"; }

    deadline=$((SECONDS + READY_TIMEOUT))
    until cluster_ready; do
        if ((SECONDS >= deadline)); then
            status "$dir" >&2 || true
            die "the cluster was not ready within ${READY_TIMEOUT} s (every node cluster_state:ok, every master with a replica in sync); logs in $dir/*/redis.log"
        fi
        sleep 0.5
    done
    echo "Redis Cluster ready: 3 masters and 3 replicas on $HOST:${PORTS[0]}-${PORTS[5]}, nodes in $dir"
    url
}

status() {
    local dir=$1 port pid info role state
    printf '%-6s %-8s %-7s %s\n' port pid role cluster_state
    for port in "${PORTS[@]}"; do
        pid=$(pid_of "$dir/$port")
        redis_pid_alive "$pid" || pid=-
        info=$(cli "$port" info replication) || info=""
        role=$(field role "$info") || role=down
        state=$(field cluster_state "$(cli "$port" cluster info)") || state=-
        printf '%-6s %-8s %-7s %s\n' "$port" "$pid" "$role" "$state"
    done
    if cluster_ready; then
        echo "healthy: $(url)"
    else
        echo "not healthy (every node needs cluster_state:ok and every master a replica in sync)"
        return 1
    fi
}

(($# >= 1 && $# <= 2)) || usage
command=$1
dir=${2:-/tmp/pulse-redis-cluster}
# redis-server changes into --dir as it reads it, so a relative --logfile or --pidfile after it
# would land in a nested path; and stop_nodes compares `CONFIG GET dir` (a canonical path) with
# the node directories. Both need DIR absolute and canonical.
[[ $command == start ]] && mkdir -p "$dir"
if [[ -d $dir ]]; then
    dir=$(cd "$dir" && pwd -P)
fi

case "$command" in
    start) start "$dir" ;;
    stop) stop_nodes "$dir" && echo "stopped the Redis Cluster nodes of $dir" ;;
    status) status "$dir" ;;
    *) usage ;;
esac
