#!/usr/bin/env bash
# `make demo`: start a private Redis (free port, no persistence) and one server
# (./epoll if built, else ./iterative) on PORT, show one guestbook request, and
# leave both running so a browser can be pointed at them.
# Usage: tools/demo.sh [PORT]   (default 8000), from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."

port=${1:-8000}
server=./iterative
[[ -x ./epoll ]] && server=./epoll
[[ -x $server ]] || { echo "demo: no server built; run 'make all'" >&2; exit 1; }

logs=$(mktemp -d "${TMPDIR:-/tmp}/zerohttpd-demo.XXXXXX")
# Port 0 makes the kernel pick a free port; the tiny race before Redis binds
# it is acceptable for a demo.
redis_port=$(python3 -c 'import socket; s = socket.socket();
s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# Wait up to 5 s for a condition while process PID lives; on failure show
# its log. Usage: wait_for NAME PID LOG COMMAND...
wait_for() {
    local what=$1 pid=$2 log=$3; shift 3
    for _ in $(seq 50); do
        "$@" >/dev/null 2>&1 && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "demo: $what did not start; its log ($log):" >&2
    cat "$log" >&2
    return 1
}

# Stop and reap what this script started, on a failed start.
stop() {
    kill "$@" 2>/dev/null || true
    wait "$@" 2>/dev/null || true
}

nohup redis-server --port "$redis_port" --bind 127.0.0.1 --save '' \
    --appendonly no --dir "$logs" >"$logs/redis.log" 2>&1 &
redis_pid=$!
wait_for "redis-server" "$redis_pid" "$logs/redis.log" \
    redis-cli -p "$redis_port" ping || { stop "$redis_pid"; exit 1; }

# Its start line, errors and access log (ZEROHTTPD_LOG=1) go to one file.
ZEROHTTPD_LOG=1 nohup "$server" "$port" 127.0.0.1 "$redis_port" \
    >"$logs/server.log" 2>&1 &
server_pid=$!
wait_for "$server" "$server_pid" "$logs/server.log" \
    grep -q "listening on port $port" "$logs/server.log" ||
    { stop "$server_pid" "$redis_pid"; exit 1; }

url="http://127.0.0.1:$port/"
echo "$server is serving $url (Redis on port $redis_port)"
echo
echo "\$ curl -i ${url}guestbook   (headers and the visitor line)"
page=$(curl -sS -i --max-time 5 "${url}guestbook") || true
printf '%s\n' "$page" | sed -n '1,/^\r\{0,1\}$/p'
printf '%s\n' "$page" | grep -m1 -i 'visitors' || true
echo
echo "Running: $server (pid $server_pid), redis-server (pid $redis_pid)"
echo "Logs:    $logs"
echo "Stop:    kill $server_pid $redis_pid"
