#!/bin/bash
# A private nginx for `make bench`, on loopback only.
#
#   bench/nginx.sh install          installs Debian's nginx if it is missing,
#                                   without leaving the system service running
#   bench/nginx.sh start DIR [PORT] writes DIR/nginx.conf and the bodies of
#                                   DIR/body/, starts nginx (daemon) on
#                                   127.0.0.1:PORT (a free one when PORT is
#                                   not given) and prints the port
#
# It answers / with "ok" (2 bytes, from the configuration), and
# /body/64k and /body/1m with exactly 65,536 and 1,048,576 bytes: static
# files, read from the page cache and sent with sendfile, with no gzip
# (nothing here turns it on), so that nginx spends as little of its core
# as it can on the large-body shapes of run.lua.
#
# With NGINX_LATENCY_MS=N (N > 0) in the environment, start makes every
# answer wait N ms first, as a real API's does (ngx.sleep: Debian's
# libnginx-mod-http-lua, which `make bench-instructions` installs anyway
# for its OpenResty shapes). / then answers "ok" from Lua, with a
# Content-Length as before, and /body/ waits in the access phase.
#   bench/nginx.sh stop DIR         stops that nginx by the pid in DIR/nginx.pid
set -euo pipefail

NGINX=/usr/sbin/nginx

log() { echo "nginx.sh: $*" >&2; }

install_nginx() {
    [ -x "$NGINX" ] && return 0
    if [ "$(id -u)" != 0 ]; then
        log "nginx is not installed and installing it needs root"
        exit 1
    fi
    log "installing Debian's nginx"
    # Keep the package's scripts from starting the system service (which
    # would listen on port 80): policy-rc.d answering 101 makes invoke-rc.d
    # and deb-systemd-invoke skip the start. Use our own only when the
    # machine has none.
    local policy=/usr/sbin/policy-rc.d ours=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod 755 "$policy"
        ours=1
    fi
    local rc=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq nginx >/dev/null; } || rc=$?
    [ "$ours" = 1 ] && rm -f "$policy"
    [ "$rc" = 0 ] || { log "apt-get install nginx failed ($rc)"; exit 1; }
    # Belt and braces: should a system nginx have started anyway, stop it.
    if [ -s /run/nginx.pid ] && kill -0 "$(cat /run/nginx.pid)" 2>/dev/null; then
        log "stopping the system nginx that the package started"
        kill -QUIT "$(cat /run/nginx.pid)" || true
    fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The bodies /body/64k and /body/1m: printable bytes of the exact sizes.
write_bodies() { # DIR
    local dir=$1/body
    mkdir -p "$dir"
    head -c 65536 /dev/zero | tr '\0' 'x' > "$dir/64k"
    head -c 1048576 /dev/zero | tr '\0' 'x' > "$dir/1m"
    chmod 755 "$dir"
    chmod 644 "$dir/64k" "$dir/1m"
}

# The modules and the two locations of the configuration: plain, or with
# every answer NGINX_LATENCY_MS late.
latency_ms() {
    local ms=${NGINX_LATENCY_MS:-0}
    case "$ms" in
        ''|*[!0-9]*) log "NGINX_LATENCY_MS must be a whole number of milliseconds (got '$ms')"; exit 2 ;;
    esac
    echo $((10#$ms))
}

write_conf() { # DIR PORT
    local dir=$1 port=$2 ms modules="" root body
    ms=$(latency_ms)
    root='location / { return 200 "ok"; }'
    body="location /body/ { root $dir; default_type application/octet-stream; }"
    if [ "$ms" -gt 0 ]; then
        modules="load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;"
        root="location / { default_type text/plain; content_by_lua_block {
            ngx.sleep($ms / 1000); ngx.header[\"Content-Length\"] = 2; ngx.print(\"ok\") } }"
        body="location /body/ { root $dir; default_type application/octet-stream;
            access_by_lua_block { ngx.sleep($ms / 1000) } }"
    fi
    cat > "$dir/nginx.conf" <<CONF
$modules
daemon on;
master_process on;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $dir/client_body;
    proxy_temp_path $dir/proxy;
    fastcgi_temp_path $dir/fastcgi;
    uwsgi_temp_path $dir/uwsgi;
    scgi_temp_path $dir/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 60s;
    # For the bodies: sendfile from the page cache, and the files kept open
    # (no open and stat a request).
    sendfile on;
    tcp_nopush on;
    open_file_cache max=16 inactive=600s;
    server {
        listen 127.0.0.1:$port;
        $root
        $body
    }
}
CONF
}

start() { # DIR [PORT]
    local dir=$1 want=${2:-} port
    install_nginx
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    chmod 755 "$dir"
    write_bodies "$dir"
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        if [ -n "$want" ]; then port=$want; else port=$((20000 + RANDOM % 40000)); fi
        if [ -z "$want" ] && port_in_use "$port"; then continue; fi
        write_conf "$dir" "$port"
        if "$NGINX" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" 2>>"$dir/start.log"; then
            # the master forks and returns; wait until the port answers
            for _ in $(seq 50); do
                if port_in_use "$port"; then echo "$port"; return 0; fi
                sleep 0.1
            done
            log "nginx started but 127.0.0.1:$port does not answer"
            stop "$dir"
            exit 1
        fi
        [ -n "$want" ] && break
        grep -q "Address already in use" "$dir/start.log" || break
    done
    log "nginx failed to start:"; cat "$dir/start.log" >&2
    exit 1
}

stop() { # DIR
    local pidfile=$1/nginx.pid pid
    [ -s "$pidfile" ] || return 0
    pid=$(cat "$pidfile")
    kill -QUIT "$pid" 2>/dev/null || return 0
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
}

case "${1:-}" in
    install) install_nginx ;;
    start) [ $# -ge 2 ] || { log "usage: $0 start DIR [PORT]"; exit 2; }; start "$2" "${3:-}" ;;
    stop) [ $# -eq 2 ] || { log "usage: $0 stop DIR"; exit 2; }; stop "$2" ;;
    *) log "usage: $0 install | start DIR [PORT] | stop DIR"; exit 2 ;;
esac
