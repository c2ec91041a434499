#!/bin/sh
# The managed Redis of a fleetmq BrokerFleet: how its Redis servers, sentinels and the Job that forms a
# Redis Cluster start, and their probes. POSIX sh using redis-server and redis-cli (plus sed, grep, timeout
# and sleep) of any Redis 7 image. Everything comes from environment variables, so the operator's pods and
# the tests (processes on loopback) run this same file:
#
#   redis.sh server          start this Redis server (exec redis-server)
#   redis.sh sentinel        start this sentinel (exec redis-server --sentinel)
#   redis.sh cluster-create  form the Redis Cluster once every node answers; nothing to do if it is formed
#   redis.sh live|ready      probes of a server;  sentinel-live|sentinel-ready  probes of a sentinel
#   redis.sh prestop         a stopping primary hands over to a replica first (sentinel mode)
#
#   REDIS_PASSWORD_FILE  the password of servers and sentinels alike (never written to a ConfigMap)
#   REDIS_MODE           standalone | sentinel | cluster
#   REDIS_SELF           HOST:PORT this server is known by (its pod's DNS name), announced to the others
#   REDIS_NODES          HOST:PORT of every server, the first one (pod 0) first
#   SENTINEL_NODES       HOST:PORT of every sentinel;  SENTINEL_SELF: this sentinel's own
#   SENTINEL_MASTER      the name the sentinels monitor the primary under
#   REDIS_PORT, SENTINEL_PORT  the ports this server or sentinel listens on (6379, 26379; those of *_SELF)
# and, with defaults: REDIS_BIND ("* -::*"), REDIS_CONF_DIR
# (/conf), REDIS_DATA_DIR (/data), REDIS_APPENDFSYNC (everysec), REDIS_MAXMEMORY (none), SENTINEL_QUORUM
# (a majority), REDIS_LOCAL (127.0.0.1, where probes reach this pod), SENTINEL_DOWN_AFTER_MS (5000), SENTINEL_FAILOVER_TIMEOUT_MS (60000), CLUSTER_REPLICAS (1),
# CLUSTER_NODE_TIMEOUT_MS (5000), CLUSTER_WAIT_SECONDS (600), REDIS_PRIMARY_WAIT_SECONDS (30: how long a
# starting server looks for a primary while the sentinels name one that is not), REDIS_SERVER, REDIS_CLI.
set -eu

REDIS_SERVER=${REDIS_SERVER:-redis-server}
REDIS_CLI=${REDIS_CLI:-redis-cli}
REDIS_PORT=${REDIS_PORT:-6379}
SENTINEL_PORT=${SENTINEL_PORT:-26379}
CONF_DIR=${REDIS_CONF_DIR:-/conf}
DATA_DIR=${REDIS_DATA_DIR:-/data}
# redis-cli reads the password from REDISCLI_AUTH, so it is never on a command line
REDISCLI_AUTH=$(cat "${REDIS_PASSWORD_FILE:?REDIS_PASSWORD_FILE: the file holding the Redis password}")
export REDISCLI_AUTH

log() { echo "fleetmq-redis: $*" >&2; }

# cli HOST:PORT ARGS...: one command's raw reply; empty when the server does not answer within 3 s
cli() {
	addr=$1
	shift
	timeout 3 "$REDIS_CLI" -h "${addr%:*}" -p "${addr##*:}" --no-auth-warning --raw "$@" 2>/dev/null || true
}

# field NAME: the value of NAME: in the INFO-style text on stdin
field() { sed -n "s/^$1:\([^[:space:]]*\).*/\1/p" | head -n 1; }

first() { echo "$1"; }

count() { echo $#; }

# value NAME: the line after the line NAME in a raw reply of field/value pairs (SENTINEL MASTER)
value() { sed -n "/^$1\$/{n;p;q;}"; }

# role_of HOST:PORT: what that server says it is (ROLE: master, slave); empty when it does not answer
role_of() { cli "$1" ROLE | head -n 1; }

# The sentinels' views of the primary, "EPOCH HOST:PORT" a line (the configuration epoch of that view), one
# from each other sentinel that answers.
sentinel_views() {
	for s in ${SENTINEL_NODES:-}; do
		[ "$s" = "${SENTINEL_SELF:-}" ] && continue
		epoch=$(cli "$s" SENTINEL MASTER "$SENTINEL_MASTER" | value config-epoch)
		# shellcheck disable=SC2046  # host and port: two lines, two words
		set -- $(cli "$s" SENTINEL get-master-addr-by-name "$SENTINEL_MASTER")
		case $epoch in '' | *[!0-9]*) continue ;; esac
		if [ $# -eq 2 ]; then
			echo "$epoch $1:$2"
		fi
	done
}

# A server (other than this one) that says it is a primary; empty when none does.
peer_primary() {
	for n in $REDIS_NODES; do
		[ "$n" = "${REDIS_SELF:-}" ] && continue
		if [ "$(role_of "$n")" = master ]; then
			echo "$n"
			return
		fi
	done
}

# find_primary WAIT: the primary a starting server or sentinel follows, "EPOCH HOST:PORT" (EPOCH: the
# configuration epoch of the sentinels' view it matches, -1 when no sentinel answers). The server the
# sentinels name is taken only once it says (ROLE) it is a master, for their views can be stale: sentinels
# learn of a failover from the hellos of the one that led it, and when that one is replaced before they got
# one, they still name the old primary, which is down or now a replica of the promoted one. In turn:
#  1. the primary of the sentinels' view with the highest configuration epoch (Sentinel's own rule) among
#     those whose primary says it is a master (this server itself, not running yet, never does);
#  2. else a server that says it is a master (the sentinels' views are stale, or every sentinel is away),
#     so a primary restarting after a failover its sentinels never heard of becomes a replica, not a second
#     primary;
#  3. else, with no sentinel answering: pod 0, the primary of a new deployment;
#  4. else the sentinels name a server that is down or a replica and no server is a master (a failover to
#     come, a primary restarting before one): this server itself when their latest view names it; else it
#     looks again every second for WAIT seconds (a server; a sentinel does not wait: it joins the others'
#     view and takes part in the failover), then follows that view.
find_primary() {
	deadline=$(($(date +%s) + $1))
	said=""
	while :; do
		views=$(sentinel_views)
		latest="" latest_epoch=-1 named="" named_epoch=-1
		while read -r epoch addr; do
			[ -n "$addr" ] || continue
			if [ "$epoch" -gt "$latest_epoch" ]; then
				latest=$addr latest_epoch=$epoch
			fi
			if [ "$epoch" -gt "$named_epoch" ] && [ "$addr" != "${REDIS_SELF:-}" ] &&
				[ "$(role_of "$addr")" = master ]; then
				named=$addr named_epoch=$epoch
			fi
		done <<-EOF
			$views
		EOF
		if [ -n "$named" ]; then
			echo "$named_epoch $named"
			return
		fi
		if [ -n "$latest" ] && [ "$latest" != "${REDIS_SELF:-}" ] && [ -z "$said" ]; then
			log "the sentinels name $latest (configuration epoch $latest_epoch), which is not a master"
		fi
		peer=$(peer_primary)
		if [ -n "$peer" ]; then
			log "following $peer, which says it is the primary"
			echo "$latest_epoch $peer"
			return
		fi
		if [ -z "$latest" ]; then
			# shellcheck disable=SC2086
			echo "-1 $(first $REDIS_NODES)"
			return
		fi
		if [ "$latest" = "${REDIS_SELF:-}" ] || [ "$(date +%s)" -ge "$deadline" ]; then
			echo "$latest_epoch $latest"
			return
		fi
		if [ -z "$said" ]; then
			log "no server is a master: looking again for up to $1 s"
			said=1
		fi
		sleep 1
	done
}

# The config files hold the password: readable by this user only, in the pod's own emptyDir.
umask 077

server() {
	conf=$CONF_DIR/redis.conf
	role="primary"
	mkdir -p "$CONF_DIR"
	{
		echo "port $REDIS_PORT"
		echo "bind ${REDIS_BIND:-* -::*}"
		echo "protected-mode no"
		echo "dir $DATA_DIR"
		echo "appendonly yes"
		echo "appendfsync ${REDIS_APPENDFSYNC:-everysec}"
		echo 'save ""'
		echo "requirepass $REDISCLI_AUTH"
		echo "masterauth $REDISCLI_AUTH"
		if [ -n "${REDIS_MAXMEMORY:-}" ]; then
			echo "maxmemory $REDIS_MAXMEMORY"
			echo "maxmemory-policy noeviction" # sessions are refused, never evicted
		fi
		case $REDIS_MODE in
		sentinel)
			echo "replica-announce-ip ${REDIS_SELF%:*}"
			echo "replica-announce-port ${REDIS_SELF##*:}"
			# shellcheck disable=SC2046  # epoch and address
			set -- $(find_primary "${REDIS_PRIMARY_WAIT_SECONDS:-30}")
			primary=$2
			if [ "$primary" != "$REDIS_SELF" ]; then
				echo "replicaof ${primary%:*} ${primary##*:}"
				role="replica of $primary"
			fi
			;;
		cluster)
			echo "cluster-enabled yes"
			echo "cluster-config-file $DATA_DIR/nodes.conf"
			echo "cluster-node-timeout ${CLUSTER_NODE_TIMEOUT_MS:-5000}"
			echo "cluster-announce-hostname ${REDIS_SELF%:*}"
			echo "cluster-preferred-endpoint-type hostname"
			role="cluster node"
			;;
		standalone) ;;
		*)
			log "REDIS_MODE must be standalone, sentinel or cluster, not '$REDIS_MODE'"
			exit 2
			;;
		esac
	} >"$conf.tmp"
	mv "$conf.tmp" "$conf"
	log "starting ${REDIS_SELF:-redis} as $role"
	unset REDISCLI_AUTH
	exec "$REDIS_SERVER" "$conf"
}

sentinel() {
	conf=$CONF_DIR/sentinel.conf
	# shellcheck disable=SC2046  # epoch and address
	set -- $(find_primary 0)
	epoch=$1 primary=$2
	# shellcheck disable=SC2086
	quorum=${SENTINEL_QUORUM:-$(($(count $SENTINEL_NODES) / 2 + 1))}
	m=$SENTINEL_MASTER
	mkdir -p "$CONF_DIR"
	{
		echo "port $SENTINEL_PORT"
		echo "bind ${REDIS_BIND:-* -::*}"
		echo "protected-mode no"
		echo "dir $CONF_DIR"
		echo "sentinel resolve-hostnames yes"
		echo "sentinel announce-hostnames yes"
		echo "sentinel announce-ip ${SENTINEL_SELF%:*}"
		echo "sentinel announce-port $SENTINEL_PORT"
		echo "requirepass $REDISCLI_AUTH"
		echo "sentinel sentinel-pass $REDISCLI_AUTH"
		echo "sentinel monitor $m ${primary%:*} ${primary##*:} $quorum"
		# The configuration epoch of the view it joins: when that names another server than the others' latest
		# view (theirs is stale: its primary is no master), an equal epoch keeps their hellos from moving this
		# sentinel back to it, while a later failover's (a higher epoch) still does.
		if [ "$epoch" -ge 0 ]; then
			echo "sentinel config-epoch $m $epoch"
		fi
		echo "sentinel auth-pass $m $REDISCLI_AUTH"
		echo "sentinel down-after-milliseconds $m ${SENTINEL_DOWN_AFTER_MS:-5000}"
		echo "sentinel failover-timeout $m ${SENTINEL_FAILOVER_TIMEOUT_MS:-60000}"
		echo "sentinel parallel-syncs $m 1"
	} >"$conf.tmp"
	mv "$conf.tmp" "$conf"
	log "starting sentinel ${SENTINEL_SELF} watching $primary (quorum $quorum)"
	unset REDISCLI_AUTH
	exec "$REDIS_SERVER" "$conf" --sentinel
}

# -- probes ------------------------------------------------------------------------------------------------
self() { echo "${REDIS_LOCAL:-127.0.0.1}:$REDIS_PORT"; }

live() { # answers at all (loading its data counts)
	case $(cli "$(self)" PING) in
	PONG* | LOADING* | MASTERDOWN* | BUSY*) exit 0 ;;
	*) exit 1 ;;
	esac
}

ready() { # serves: a replica once in sync with its primary, a cluster node once the cluster is whole
	[ "$(cli "$(self)" PING)" = PONG ] || exit 1
	case $REDIS_MODE in
	sentinel)
		info=$(cli "$(self)" INFO replication)
		[ "$(echo "$info" | field role)" = master ] || [ "$(echo "$info" | field master_link_status)" = up ]
		;;
	cluster)
		heal
		[ "$(cli "$(self)" CLUSTER INFO | field cluster_state)" = ok ]
		;;
	esac
}

# Redis Cluster's bus knows its peers by IP address only: a peer whose pod came back with another IP while
# every other node was down too is found again here, by its DNS name (CLIENT INFO tells its address).
heal() {
	nodes=$(cli "$(self)" CLUSTER NODES)
	[ "$(echo "$nodes" | grep -c .)" -gt 1 ] || return 0 # not formed yet: that is cluster-create's job
	for n in $REDIS_NODES; do
		[ "$n" = "${REDIS_SELF:-}" ] && continue
		ip=$(cli "$n" CLIENT INFO | sed -n 's/.* laddr=\([^ ]*\):[0-9]* .*/\1/p')
		[ -n "$ip" ] || continue
		if ! echo "$nodes" | grep -q " $ip:${n##*:}@"; then
			log "meeting $n at $ip"
			cli "$(self)" CLUSTER MEET "$ip" "${n##*:}" >/dev/null
		fi
	done
}

sentinel_live() { [ "$(cli "${REDIS_LOCAL:-127.0.0.1}:$SENTINEL_PORT" PING)" = PONG ]; }

sentinel_ready() { # enough sentinels reachable to agree on a failover
	cli "${REDIS_LOCAL:-127.0.0.1}:$SENTINEL_PORT" SENTINEL CKQUORUM "$SENTINEL_MASTER" | grep -q '^OK'
}

# A primary being stopped asks the sentinels to promote a replica first and waits (up to 20 s) until it is
# one itself, so a rolling update costs the brokers a planned switch rather than a detected failure.
# caught_up: wait (2 s at most) until every replica has all this primary has written
caught_up() {
	i=0
	while [ $i -lt 20 ]; do
		info=$(cli "$(self)" INFO replication)
		offset=$(echo "$info" | field master_repl_offset)
		behind=0
		for o in $(echo "$info" | sed -n 's/^slave[0-9]*:.*offset=\([0-9]*\).*/\1/p'); do
			[ "$o" -lt "${offset:-0}" ] && behind=1
		done
		[ $behind -eq 0 ] && return 0
		sleep 0.1
		i=$((i + 1))
	done
}

# A stopping primary hands over to a replica first. Writes stop before the switch: a replica promoted while
# the primary still takes writes would miss those another replica acknowledged (a broker's WAIT), and they
# would be gone once that replica resynchronised from the new primary. The primary pauses writes, lets its
# replicas catch up, asks a sentinel to fail over, becomes a replica of the new primary itself (the paused
# writes then fail with READONLY instead of landing here), and only then lets clients go on.
prestop() {
	[ "$REDIS_MODE" = sentinel ] || exit 0
	[ "$(cli "$(self)" ROLE | head -n 1)" = master ] || exit 0
	cli "$(self)" CLIENT PAUSE 30000 WRITE >/dev/null
	caught_up
	for s in $SENTINEL_NODES; do
		old=$(cli "$s" SENTINEL get-master-addr-by-name "$SENTINEL_MASTER" | tr -d '\r' | tr '\n' ' ')
		if [ "$(cli "$s" SENTINEL FAILOVER "$SENTINEL_MASTER")" = OK ]; then
			log "asked sentinel $s to fail over"
			i=0
			while [ $i -lt 40 ]; do
				new=$(cli "$s" SENTINEL get-master-addr-by-name "$SENTINEL_MASTER" | tr -d '\r' | tr '\n' ' ')
				if [ -n "${new% }" ] && [ "$new" != "$old" ]; then
					# shellcheck disable=SC2086  # host and port
					set -- $new
					cli "$(self)" REPLICAOF "$1" "$2" >/dev/null
					log "now a replica of $1:$2"
					break
				fi
				sleep 0.5
				i=$((i + 1))
			done
			cli "$(self)" CLIENT UNPAUSE >/dev/null
			exit 0
		fi
	done
	cli "$(self)" CLIENT UNPAUSE >/dev/null
	log "no sentinel would fail over"
}

# -- the Redis Cluster -------------------------------------------------------------------------------------
cluster_create() {
	deadline=$(($(date +%s) + ${CLUSTER_WAIT_SECONDS:-600}))
	for n in $REDIS_NODES; do
		until [ "$(cli "$n" PING)" = PONG ]; do
			if [ "$(date +%s)" -ge "$deadline" ]; then
				log "$n does not answer; giving up for now"
				exit 1
			fi
			sleep 2
		done
	done
	keys=0
	for n in $REDIS_NODES; do
		if [ "$(cli "$n" CLUSTER INFO | field cluster_slots_assigned)" = 16384 ]; then
			log "the cluster is formed ($n serves every slot)"
			exit 0
		fi
		keys=$((keys + $(cli "$n" DBSIZE)))
	done
	if [ "$keys" -gt 0 ]; then
		log "not every slot is served but nodes hold data: repair by hand (redis-cli --cluster fix)"
		exit 1
	fi
	for n in $REDIS_NODES; do # an earlier attempt that stopped half-way, with no data: start afresh
		cli "$n" CLUSTER RESET HARD >/dev/null
	done
	log "creating the cluster of $REDIS_NODES"
	# shellcheck disable=SC2086
	timeout 300 "$REDIS_CLI" --no-auth-warning --cluster create $REDIS_NODES \
		--cluster-replicas "${CLUSTER_REPLICAS:-1}" --cluster-yes
	for n in $REDIS_NODES; do
		until [ "$(cli "$n" CLUSTER INFO | field cluster_state)" = ok ]; do
			[ "$(date +%s)" -lt "$deadline" ] || exit 1
			sleep 1
		done
	done
	log "the cluster is formed"
}

case ${1:-} in
server) server ;;
sentinel) sentinel ;;
cluster-create) cluster_create ;;
live) live ;;
ready) ready ;;
prestop) prestop ;;
sentinel-live) sentinel_live ;;
sentinel-ready) sentinel_ready ;;
*)
	echo "usage: redis.sh server|sentinel|cluster-create|live|ready|prestop|sentinel-live|sentinel-ready" >&2
	exit 2
	;;
esac
