"""`fleetmq-broker` / `python -m fleetmq.broker`: run one broker node (or, with --workers, several)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import resource
import ssl
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from .config import BrokerConfig, ConfigError, load_config, parse_bind

DEFAULT_LISTEN = "127.0.0.1:1883"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleetmq-broker", description="Run a fleetmq MQTT broker node.")
    p.add_argument("--config", metavar="FILE", help="YAML config file (validated; see docs/design.md)")
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        action="append",
        help="a tcp listener in zone 'default' (repeatable); replaces the config's listeners",
    )
    p.add_argument("--node-id", help="node identifier (default: the config's, else the hostname)")
    p.add_argument("--metrics", metavar="HOST:PORT", help="serve /metrics, /healthz and /readyz here")
    p.add_argument(
        "--redis-url", metavar="URL", help="keep sessions in Redis (redis://host:port/db): a fleet node"
    )
    p.add_argument(
        "--redis-wait-replicas",
        metavar="N",
        type=int,
        help="acks also wait until N Redis replicas have the writes (WAIT)",
    )
    p.add_argument(
        "--event-log",
        action="store_true",
        help="append delivery events to the fleet's Redis Streams (the pipeline's input; see event_log:)",
    )
    p.add_argument(
        "--workers",
        metavar="N",
        type=int,
        default=1,
        help="run N broker processes sharing the listeners (SO_REUSEPORT), each a node of the fleet; "
        "needs the Redis store",
    )
    p.add_argument("--worker-socket", help=argparse.SUPPRESS)  # set by the supervisor of --workers
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error("--workers must be at least 1")
    return args


def _raise_nofile() -> None:
    """Each client is a file descriptor: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def passwd(argv: Sequence[str]) -> int:
    """`fleetmq-broker passwd FILE USER`: add or update a user of a users file."""
    import getpass

    from .auth import UsersFileError, set_password

    p = argparse.ArgumentParser(
        prog="fleetmq-broker passwd", description="Add or update a user of a users file."
    )
    p.add_argument("file", help="the users file (created if missing)")
    p.add_argument("user")
    p.add_argument("--password", help="the password (default: asked for, or read from stdin)")
    args = p.parse_args(argv)
    password = args.password
    if password is None:
        password = (
            getpass.getpass(f"password for {args.user}: ") if sys.stdin.isatty() else sys.stdin.readline()
        )
        password = password.rstrip("\n")
    if not password:
        print("fleetmq-broker passwd: empty password", file=sys.stderr)
        return 2
    try:
        set_password(args.file, args.user, password)
    except (UsersFileError, OSError) as e:
        print(f"fleetmq-broker passwd: {e}", file=sys.stderr)
        return 2
    return 0


def apikey(argv: Sequence[str]) -> int:
    """`fleetmq-broker apikey FILE NAME --role admin|viewer`: make a management API key."""
    from .apikeys import NAME, ApiKeysError, add

    p = argparse.ArgumentParser(
        prog="fleetmq-broker apikey",
        description="Add (or replace) a key of a management API keys file; the new key is printed on the "
        "last line, and only its hash is stored.",
    )
    p.add_argument("file", help="the keys file (created if missing)")
    p.add_argument("name", help="who the key is for (lower-case letters, digits and '-')")
    p.add_argument("--role", choices=["admin", "viewer"], required=True, help="viewer: GET only")
    p.add_argument("--zone", help="publishing with this key checks this zone's ACL")
    args = p.parse_args(argv)
    import re

    if not re.fullmatch(NAME, args.name):
        print(
            f"fleetmq-broker apikey: name {args.name!r}: lower-case letters, digits and '-'", file=sys.stderr
        )
        return 2
    try:
        key = add(args.file, args.name, args.role, args.zone)
    except (ApiKeysError, OSError) as e:
        print(f"fleetmq-broker apikey: {e}", file=sys.stderr)
        return 2
    print(f"key {args.name!r} ({args.role}) stored as a hash in {args.file}; it is shown only now:")
    print(key)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["passwd"]:
        return passwd(argv[1:])
    if argv[:1] == ["apikey"]:
        return apikey(argv[1:])
    args = parse_args(argv)
    worker = f" [{args.node_id}]" if args.worker_socket else ""
    logging.basicConfig(
        level=args.log_level.upper(), format=f"%(asctime)s %(levelname)s{worker} %(name)s: %(message)s"
    )
    overrides: dict[str, object] = {}
    if args.node_id:
        overrides["node_id"] = args.node_id
    if args.metrics:
        overrides["metrics"] = {"bind": args.metrics}
    if args.redis_url or args.redis_wait_replicas is not None:
        store: dict[str, object] = {"kind": "redis"}
        if args.redis_url:
            store["url"] = args.redis_url
        if args.redis_wait_replicas is not None:
            store["wait_replicas"] = args.redis_wait_replicas
        overrides["store"] = store
    if args.event_log:
        overrides["event_log"] = {"enabled": True}
    if args.listen:
        try:
            for bind in args.listen:
                parse_bind(bind)
        except ValueError as e:
            print(f"fleetmq-broker: --listen: {e}", file=sys.stderr)
            return 2
        overrides["listeners"] = [
            {"name": f"tcp-{i}" if i else "tcp", "zone": "default", "bind": bind, "protocol": "tcp"}
            for i, bind in enumerate(args.listen)
        ]

    def load(empty_ok: bool = True) -> BrokerConfig:
        config = load_config(args.config, overrides=overrides, empty_ok=empty_ok)
        if not config.listeners:
            listener = {"name": "tcp", "zone": "default", "bind": DEFAULT_LISTEN}
            config = load_config(args.config, overrides={**overrides, "listeners": [listener]})
        return config

    def reload() -> BrokerConfig:
        return load(empty_ok=False)

    try:
        config = load()
    except ConfigError as e:
        print(
            f"fleetmq-broker: invalid config{' ' + args.config if args.config else ''}:\n{e}", file=sys.stderr
        )
        return 2
    _raise_nofile()
    if args.workers > 1:
        from . import workers

        if (why := workers.check(config, args.workers)) is not None:
            print(f"fleetmq-broker: {why}", file=sys.stderr)
            return 2
        return asyncio.run(workers.Supervisor(config, [*argv, "--workers", "1"], args.workers).run())
    from .auth import UsersFileError
    from .server import run

    runner: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        pass
    _tune_gc()
    try:
        runner(run(config, reload, args.config, args.worker_socket))
    except OSError as e:
        logging.getLogger("fleetmq").error("cannot start: %s", e)
        return 1
    except (ConfigError, NotImplementedError, UsersFileError, ssl.SSLError) as e:
        logging.getLogger("fleetmq").error("%s", e)
        return 2
    return 0


#: allocations of container objects between two young collections (CPython's default is 700)
GC_THRESHOLD = 50_000


def _tune_gc() -> None:
    """Every delivery allocates container objects (a Delivery, the acknowledgement packets), and with
    CPython's defaults a young collection ran every 700 of them, walking objects that live as long as
    the process too: a sixth of the broker's CPU in the QoS 2 fan-out (perf, bench fanout-q2). What is
    loaded by now is frozen out of collections, and young ones run every GC_THRESHOLD allocations: the
    per-message objects hold no cycles, and cycles elsewhere are still collected, a little later."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, older, oldest)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
