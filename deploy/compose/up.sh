#!/usr/bin/env bash
# Starts the compose cluster (deploy/compose/compose.yaml), waits until its
# init service reports the cluster ready (3 voters, every node UP), then
# copies the CA and the admin certificate out of their volumes into
# .curia-compose/ and writes .curia-compose/env, as `make run` writes
# .curia/env. Last it starts the dashboard on the host (curia-local
# dashboard: curia-dashboard, detached, on a loopback address, with the
# admin's credentials, against the published ports) and prints its URL.
# `make up` runs it; running it again is harmless (the cluster comes back
# from its volumes) and refreshes the env file and the dashboard, e.g.
# after `docker compose up -d --scale curator=3`. `make down` stops the
# dashboard too.
#
#   deploy/compose/up.sh [docker compose up options, e.g. --scale curator=3]
#
# Environment: COMPOSE (the compose command; default `docker compose`, else
# `docker-compose`), COMPOSE_PROJECT_NAME (default curia), CURIA_IMAGE
# (default curia:dev), CURIA_HOST_IP (where ports are published, default
# 127.0.0.1), CURIA_COMPOSE_OUT (default .curia-compose at the repository's
# root), CURIA_UP_TIMEOUT (seconds to wait for init, default 300), GRPCURL
# (the pinned grpcurl: the env file puts its directory first on PATH, so
# the printed command works in a fresh shell; make up passes it),
# CURIA_BIN (curia-local and curia-dashboard; default bin at the
# repository's root, make build's), CURIA_DASHBOARD (the dashboard's
# address; default port 7001 of CURIA_HOST_IP when that is a loopback
# address, else of 127.0.0.1: never another interface, and not make run's
# 127.0.0.1:7000, so both clusters can run; "off": no dashboard).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${CURIA_COMPOSE_OUT:-$root/.curia-compose}
timeout=${CURIA_UP_TIMEOUT:-300}
bin=${CURIA_BIN:-$root/bin}
host_ip=${CURIA_HOST_IP:-127.0.0.1}
case $host_ip in
127.*) dashboard=${CURIA_DASHBOARD:-$host_ip:7001} ;;
*) dashboard=${CURIA_DASHBOARD:-127.0.0.1:7001} ;;
esac
export COMPOSE_FILE=$here/compose.yaml
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-curia}
export CURIA_IMAGE=${CURIA_IMAGE:-curia:dev}
if [ -z "${COMPOSE:-}" ]; then
	if docker compose version >/dev/null 2>&1; then COMPOSE="docker compose"; else COMPOSE=docker-compose; fi
fi
compose() { $COMPOSE "$@"; }

if [ -n "${GRPCURL:-}" ] && [ ! -x "$GRPCURL" ]; then
	echo "up.sh: GRPCURL=$GRPCURL is no executable: run 'make tools' (make up installs it)" >&2
	exit 1
fi
if [ "$dashboard" != off ] && { [ ! -x "$bin/curia-local" ] || [ ! -x "$bin/curia-dashboard" ]; }; then
	echo "up.sh: no $bin/curia-local or $bin/curia-dashboard, which run the dashboard: run 'make build' (make up does), or set CURIA_DASHBOARD=off" >&2
	exit 1
fi
if ! docker image inspect "$CURIA_IMAGE" >/dev/null 2>&1; then
	echo "up.sh: no image $CURIA_IMAGE (there is no registry to pull from): run 'make images'" >&2
	exit 1
fi

begun=$(date +%s)
compose up -d "$@"

# init is a one-shot service: it exits 0 once the cluster has its shape.
init=$(compose ps -a -q init | head -n1)
if [ -z "$init" ]; then
	echo "up.sh: no init container" >&2
	exit 1
fi
echo "curia: waiting for init (up to ${timeout}s; logs: $COMPOSE logs -f init)"
if ! code=$(timeout "$timeout" docker wait "$init"); then
	echo "up.sh: init did not finish within ${timeout}s" >&2
	compose ps >&2 || true
	compose logs --tail 20 init >&2 || true
	exit 1
fi
if [ "$code" != 0 ]; then
	echo "up.sh: init exited $code" >&2
	compose logs --tail 40 init >&2 || true
	exit 1
fi
ready=$(( $(date +%s) - begun ))

# The admin's files, out of their volumes (the init container mounts them).
mkdir -p "$out"
out=$(cd "$out" && pwd)
printf '# written by deploy/compose/up.sh\n*\n' >"$out/.gitignore"
docker cp "$init:/state/public/ca.crt" "$out/ca.crt"
docker cp "$init:/state/secrets/admin/tls.crt" "$out/admin-admin.crt"
docker cp "$init:/state/secrets/admin/tls.key" "$out/admin-admin.key"
chmod 600 "$out/admin-admin.key"

# Host ports: one per replica (curators and reconcilers publish from a
# range), fixed per node for consensus (710N) and roleserve (740N).
ports() { # service container-port -> host:port,host:port,...
	local list=() id
	for id in $(compose ps -q "$1"); do
		list+=("$(docker port "$id" "$2/tcp" | head -n1)")
	done
	(IFS=,; echo "${list[*]}")
}
curators=$(ports curator 7200)
curators_http=$(ports curator 7201)
reconcilers=$(ports reconciler 7300)
consensus=$(for n in node1 node2 node3; do ports "$n" 7100; done | paste -sd,)
roleserves=$(for n in node1 node2 node3 node4; do ports "$n" 7400; done | paste -sd,)

path_line=
if [ -n "${GRPCURL:-}" ]; then
	grpcurl_dir=$(cd "$(dirname "$GRPCURL")" && pwd)
	path_line="export PATH=\"$(printf '%s' "$grpcurl_dir" | sed 's/[\\"$`]/\\&/g'):\$PATH\""
fi
cat >"$out/env" <<EOF
# curia compose cluster (deploy/compose, project $COMPOSE_PROJECT_NAME): source this file, then use grpcurl with these variables.
${path_line}
export CURIA_CURATOR=${curators%%,*}
export CURIA_CURATOR_HTTP=https://${curators_http%%,*}
export CURIA_CACERT=$out/ca.crt
export CURIA_ADMIN_CERT=$out/admin-admin.crt
export CURIA_ADMIN_KEY=$out/admin-admin.key
export CURIA_TLS="-cacert \$CURIA_CACERT -cert \$CURIA_ADMIN_CERT -key \$CURIA_ADMIN_KEY"
export CURIA_CURATORS=$curators
export CURIA_RECONCILER=${reconcilers%%,*}
export CURIA_RECONCILERS=$reconcilers
export CURIA_CONSENSUS=$consensus
export CURIA_ROLESERVES=$roleserves
EOF

# The dashboard, anew: the published ports may have changed. It prints
# the line with its URL, printed last below.
dashboard_line= dashboard_failed=
if [ "$dashboard" != off ]; then
	dashboard_line=$("$bin/curia-local" dashboard --state "$out" --bin "$bin" --listen "$dashboard") || dashboard_failed=1
fi

rel=${out#"$PWD"/}
cat <<EOF
curia: compose cluster ready in ${ready}s: 3 voters, every node UP

  source $rel/env
  grpcurl \$CURIA_TLS \$CURIA_CURATOR curia.curator.v1.Management/GetNodes

'make down' stops it and the dashboard (the volumes keep the data); 'make down-volumes' deletes it.
EOF
if [ -n "$dashboard_failed" ]; then
	echo "up.sh: the cluster is up, but the dashboard did not start (above; its log: $rel/dashboard.log)" >&2
	exit 1
fi
if [ -n "$dashboard_line" ]; then
	echo "$dashboard_line"
fi
