#!/bin/sh
# Like the official image's docker-entrypoint.sh: options alone run redis-server with them. The official
# image is built with protected mode off (it runs behind the pod network, not on a host); Debian's
# redis-server is not, so say it here, before the caller's arguments (which may override it).
set -e
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
  set -- redis-server "$@"
fi
if [ "$1" = redis-server ]; then
  shift
  set -- redis-server --protected-mode no "$@"
fi
exec "$@"
