#!/usr/bin/env bash
# The test command: the whole cargo test suite on SQLite, then the integration tests again on
# PostgreSQL and on MariaDB/MySQL (the tests pick the SQL backend from PULSE_TEST_DATABASE), and
# once more on SQLite with Redis Cluster instead of a single Redis.
#
#   bash scripts/test-all.sh                  # sqlite, postgres, mysql, cluster
#   bash scripts/test-all.sh sqlite postgres  # only these backends
#   bash scripts/test-all.sh --no-setup       # never install or start anything (PULSE_TEST_SETUP=0)
#
# Needs Redis at PULSE_TEST_REDIS_URL, PostgreSQL at PULSE_TEST_POSTGRES_URL and MariaDB at
# PULSE_TEST_MYSQL_URL (defaults below). The cluster backend uses PULSE_TEST_CLUSTER_URL; left
# unset, it starts a local six-node cluster itself (scripts/redis-cluster.sh, ports 7000-7005, or
# from PULSE_CLUSTER_BASE_PORT).
#
# Set-up: when a server a chosen backend needs is at its default loopback address but does not
# answer there (or its client or the C compiler is missing), the script runs `.ci/run tools
# services` first, as root: on Debian that installs with apt what is missing (redis-server,
# postgresql, mariadb-server, their clients, build-essential) and starts Redis, the local Redis
# Cluster, PostgreSQL and MariaDB, leaving alone whatever already runs. Not root, it says what to
# run instead and goes on; servers given by URL elsewhere are the caller's to run.
# Every backend runs even when an earlier one fails; the exit status is non-zero if any failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# The tests wait on I/O far more than on the CPU: run more of them than there are cores.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-8}"
export PULSE_TEST_POSTGRES_URL="${PULSE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export PULSE_TEST_MYSQL_URL="${PULSE_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
export PULSE_TEST_REDIS_URL="${PULSE_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
# A cluster given by URL is the caller's to run; only the default one is started here.
CLUSTER_URL_GIVEN=${PULSE_TEST_CLUSTER_URL:+1}
cluster_base_port=${PULSE_CLUSTER_BASE_PORT:-7000}
PULSE_TEST_CLUSTER_URL="${PULSE_TEST_CLUSTER_URL:-redis+cluster://127.0.0.1:$cluster_base_port,127.0.0.1:$((cluster_base_port + 1)),127.0.0.1:$((cluster_base_port + 2))}"
# The tests name their databases pulse_t_<run>_<random>: this run's are dropped after each backend,
# and no one else's.
export PULSE_TEST_RUN="${PULSE_TEST_RUN:-$(date +%s)$$}"

case ${PULSE_TEST_SETUP:-1} in
    0 | false | no | off) setup=0 ;;
    *) setup=1 ;;
esac
backends=()
for arg in "$@"; do
    case "$arg" in
        --no-setup) setup=0 ;;
        *) backends+=("$arg") ;;
    esac
done
if [[ ${#backends[@]} -eq 0 ]]; then
    backends=(sqlite postgres mysql cluster)
fi
# Only the cluster backend runs without the single Redis.
needs_redis=0
for backend in "${backends[@]}"; do
    case "$backend" in
        sqlite | postgres | mysql) needs_redis=1 ;;
        cluster) ;;
        *)
            echo "unknown backend '$backend' (expected sqlite, postgres, mysql or cluster)" >&2
            exit 2
            ;;
    esac
done

header() {
    printf '\n==== %s ====\n' "$*"
}

have() {
    command -v "$1" >/dev/null 2>&1
}

# Splits PULSE_TEST_MYSQL_URL (mysql://user[:password]@host[:port]/db) into mariadb client options.
mysql_args() {
    local rest=${PULSE_TEST_MYSQL_URL#*://} credentials="root" address user password host port db
    if [[ $rest == *@* ]]; then
        credentials=${rest%%@*}
        rest=${rest#*@}
    fi
    user=${credentials%%:*}
    password=""
    [[ $credentials == *:* ]] && password=${credentials#*:}
    address=${rest%%/*}
    db=${rest#*/}
    db=${db%%\?*}
    [[ $rest == */* ]] || db=""
    host=${address%%:*}
    port=3306
    [[ $address == *:* ]] && port=${address##*:}
    MYSQL_ARGS=(-h "$host" -P "$port" -u "$user" --connect-timeout=5)
    [[ -n $password ]] && MYSQL_ARGS+=("-p$password")
    [[ -n $db ]] && MYSQL_ARGS+=("$db")
    return 0
}

# Databases left behind by interrupted earlier runs (tests name theirs pulse_t_*). Best effort; a
# database something is connected to (another test run, say) is left alone.
drop_leftover_postgres() {
    have psql || return 0
    local names name
    names=$(PGCONNECT_TIMEOUT=5 psql "$PULSE_TEST_POSTGRES_URL" -Atc \
        "select datname from pg_database where datname like 'pulse\_t\_%'
           and datname not in (select datname from pg_stat_activity where datname is not null)" \
        2>/dev/null) || return 0
    for name in $names; do
        PGCONNECT_TIMEOUT=5 psql "$PULSE_TEST_POSTGRES_URL" -qAtc "DROP DATABASE IF EXISTS \"$name\"" \
            >/dev/null 2>&1 || echo "warning: cannot drop leftover PostgreSQL database $name" >&2
    done
    [[ -z $names ]] || echo "dropped leftover PostgreSQL test databases: $(echo "$names" | wc -w)"
}

drop_leftover_mysql() {
    have mariadb || return 0
    local names name
    mysql_args
    names=$(mariadb "${MYSQL_ARGS[@]}" -N -e \
        "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'pulse\\_t\\_%'
           AND schema_name NOT IN (SELECT db FROM information_schema.processlist WHERE db IS NOT NULL)" \
        2>/dev/null) || return 0
    for name in $names; do
        mariadb "${MYSQL_ARGS[@]}" -e "DROP DATABASE IF EXISTS \`$name\`" >/dev/null 2>&1 ||
            echo "warning: cannot drop leftover MariaDB database $name" >&2
    done
    [[ -z $names ]] || echo "dropped leftover MariaDB test databases: $(echo "$names" | wc -w)"
}

# This run's databases, once its tests are over (none of them is in use any more).
drop_this_runs_postgres() {
    have psql || return 0
    local names name
    names=$(PGCONNECT_TIMEOUT=5 psql "$PULSE_TEST_POSTGRES_URL" -Atc \
        "select datname from pg_database where datname like 'pulse\_t\_${PULSE_TEST_RUN}\_%'") || return 0
    for name in $names; do
        PGCONNECT_TIMEOUT=5 psql "$PULSE_TEST_POSTGRES_URL" -qAtc "DROP DATABASE IF EXISTS \"$name\" WITH (FORCE)" \
            >/dev/null || echo "warning: cannot drop PostgreSQL test database $name" >&2
    done
    echo "dropped this run's PostgreSQL test databases: $(echo "$names" | wc -w)"
}

drop_this_runs_mysql() {
    have mariadb || return 0
    local names name
    mysql_args
    names=$(mariadb "${MYSQL_ARGS[@]}" -N -e \
        "SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'pulse\\_t\\_${PULSE_TEST_RUN}\\_%'") ||
        return 0
    for name in $names; do
        mariadb "${MYSQL_ARGS[@]}" -e "DROP DATABASE IF EXISTS \`$name\`" >/dev/null ||
            echo "warning: cannot drop MariaDB test database $name" >&2
    done
    echo "dropped this run's MariaDB test databases: $(echo "$names" | wc -w)"
}

# A server that does not answer fails its backend at once, with one clear line instead of a
# failure per test. Skipped when the client is not installed (the tests will say what is wrong).
check_server() {
    case "$1" in
        redis)
            have redis-cli || return 0
            [[ $(timeout 5 redis-cli -u "$PULSE_TEST_REDIS_URL" ping 2>/dev/null) == PONG ]] ||
                { echo "Redis does not answer at $PULSE_TEST_REDIS_URL" >&2; return 1; }
            ;;
        postgres)
            have psql || return 0
            PGCONNECT_TIMEOUT=5 psql "$PULSE_TEST_POSTGRES_URL" -qAtc 'select 1' >/dev/null ||
                { echo "PostgreSQL does not answer at $PULSE_TEST_POSTGRES_URL" >&2; return 1; }
            ;;
        mysql)
            have mariadb || return 0
            mysql_args
            mariadb "${MYSQL_ARGS[@]}" -e 'select 1' >/dev/null ||
                { echo "MariaDB does not answer at $PULSE_TEST_MYSQL_URL" >&2; return 1; }
            ;;
        cluster)
            # redis-cli takes no redis+cluster:// URL: ask the first seed. With credentials in the
            # URL, leave it to the tests.
            have redis-cli || return 0
            local seed=${PULSE_TEST_CLUSTER_URL#*://}
            seed=${seed%%[,/?]*}
            [[ $seed == *@* ]] && return 0
            [[ $(timeout 5 redis-cli -h "${seed%:*}" -p "${seed##*:}" cluster info 2>/dev/null) == *cluster_state:ok* ]] ||
                { echo "Redis Cluster is not healthy at $PULSE_TEST_CLUSTER_URL (no cluster_state:ok from $seed)" >&2; return 1; }
            ;;
    esac
}

# Whether something accepts TCP connections on 127.0.0.1:$1 (needs no client tools).
port_open() {
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# What the chosen backends need that is missing at its default address, one word each (empty
# when nothing is). A server given by another URL is not this script's to set up.
missing_locally() {
    local missing=() backend
    have cc || missing+=(compiler)
    if ((needs_redis)) && [[ $PULSE_TEST_REDIS_URL == redis://127.0.0.1:6379 ]]; then
        { have redis-cli && port_open 6379; } || missing+=(redis)
    fi
    for backend in "${backends[@]}"; do
        case "$backend" in
            postgres)
                [[ $PULSE_TEST_POSTGRES_URL == postgres://postgres@127.0.0.1:5432/test ]] &&
                    ! { have psql && port_open 5432; } && missing+=(postgresql)
                ;;
            mysql)
                [[ $PULSE_TEST_MYSQL_URL == mysql://root@127.0.0.1:3306/test ]] &&
                    ! { have mariadb && port_open 3306; } && missing+=(mariadb)
                ;;
            cluster)
                [[ -z $CLUSTER_URL_GIVEN ]] && ! have redis-server && missing+=(redis-server)
                ;;
        esac
    done
    echo "${missing[*]}"
}

# Installs and starts what the chosen backends lack, through the CI script's own steps.
set_up() {
    ((setup)) || return 0
    local missing
    missing=$(missing_locally)
    [[ -n $missing ]] || return 0
    header "set-up: missing or not running: $missing"
    if ((EUID != 0)); then
        echo "not root, so nothing is installed or started: run 'sudo bash .ci/run tools services'" \
            "(Debian), or start the servers yourself; --no-setup skips this check" >&2
        return 0
    fi
    bash .ci/run tools services
}

start_cluster() {
    [[ -z $CLUSTER_URL_GIVEN ]] || return 0
    bash scripts/redis-cluster.sh start ||
        { echo "cannot start the local Redis Cluster (bash scripts/redis-cluster.sh start)" >&2; return 1; }
}

set_up

# What the tests write to files (SQLite databases, data dirs, private Redis servers' dirs: over a
# thousand per run) goes under one directory of this run, removed at the end if every backend
# passed; a failed run keeps it for a look.
tests_tmp=$(mktemp -d "${TMPDIR:-/tmp}/pulse-tests.XXXXXX")
export TMPDIR=$tests_tmp

header "build (tests of the whole workspace)"
cargo test --workspace --no-run

if ((needs_redis)); then
    check_server redis || { echo "start Redis first (see .ci/run)" >&2; exit 1; }
fi

declare -A outcome=()
for backend in "${backends[@]}"; do
    case "$backend" in
        sqlite)
            header "SQLite: the whole test suite (PULSE_TEST_DATABASE=sqlite)"
            if PULSE_TEST_DATABASE=sqlite cargo test --workspace 2>&1 | tee "$tests_tmp/$backend.log"; then
                outcome[$backend]=passed
            else
                outcome[$backend]=FAILED
            fi
            ;;
        postgres | mysql)
            if [[ $backend == postgres ]]; then
                header "PostgreSQL: integration tests (PULSE_TEST_DATABASE=postgres, $PULSE_TEST_POSTGRES_URL)"
                drop_leftover_postgres
            else
                header "MariaDB: integration tests (PULSE_TEST_DATABASE=mysql, $PULSE_TEST_MYSQL_URL)"
                drop_leftover_mysql
            fi
            # The two churn tests (a hundred subscribers reconnecting while a thousand items are
            # published) test the journals in Redis; what they ask of SQL, the other feed and
            # resume tests ask on every backend. They run on SQLite and the cluster, and here
            # would only add minutes.
            if check_server "$backend" && PULSE_TEST_DATABASE=$backend cargo test --workspace --tests -- \
                --skip resume::a_hundred_feed_subscribers_reconnecting \
                --skip resume::article_subscribers_reconnecting_at_random 2>&1 |
                tee "$tests_tmp/$backend.log"; then
                outcome[$backend]=passed
            else
                outcome[$backend]=FAILED
            fi
            if [[ $backend == postgres ]]; then
                drop_this_runs_postgres
            else
                drop_this_runs_mysql
            fi
            ;;
        cluster)
            # The SQL side is SQLite (temporary files, nothing to drop); only Redis changes.
            header "Redis Cluster: integration tests (PULSE_TEST_DATABASE=sqlite, $PULSE_TEST_CLUSTER_URL)"
            if start_cluster && check_server cluster &&
                PULSE_TEST_DATABASE=sqlite PULSE_TEST_REDIS_URL=$PULSE_TEST_CLUSTER_URL \
                    cargo test -p pulse --test api 2>&1 | tee "$tests_tmp/$backend.log"; then
                outcome[$backend]=passed
            else
                outcome[$backend]=FAILED
            fi
            ;;
    esac
done

# Why each failed test failed, where the end of the log is read: a failure's panic is otherwise
# hundreds of lines up, among the other tests' output.
failures() {
    local log=$tests_tmp/$1.log
    [[ -f $log ]] || return 0
    grep -A2 "^thread '.*' panicked at" "$log" | cut -c1-600 | head -60 | sed 's/^/    /'
}

header "summary"
status=0
for backend in "${backends[@]}"; do
    printf '%-9s %s\n' "$backend" "${outcome[$backend]}"
    if [[ ${outcome[$backend]} != passed ]]; then
        status=1
        failures "$backend"
    fi
done
if ((status == 0)); then
    rm -rf "$tests_tmp"
else
    echo "the tests' files are kept in $tests_tmp"
fi
exit "$status"
