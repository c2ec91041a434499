"""``fleetmq-pipeline``: ``export`` (Redis Streams -> Parquet) and ``report`` (the Spark job)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict

from fleetmq.broker.zones import parse_duration

USAGE = """fleetmq-pipeline COMMAND ...

  export   move a fleet's events from its Redis Streams to Parquet files (crash-safe, no duplicates)
  report   zone KPIs, recommended settings, a Markdown report and an MqttZone patch (Spark)

`fleetmq-pipeline COMMAND --help` for the options of one."""


def export_parser() -> argparse.ArgumentParser:
    from fleetmq.pipeline.export import DEFAULT_CONSUMER, DEFAULT_GROUP

    p = argparse.ArgumentParser(
        prog="fleetmq-pipeline export",
        description="Move a fleet's events (streams fmq:eventlog:<fleet>:...) to Parquet files partitioned by date "
        "and zone; entries are acknowledged only once their file is in place.",
    )
    p.add_argument(
        "--redis-url",
        required=True,
        help="redis://host:6379/0, the fleet's Redis (any node of a Redis Cluster)",
    )
    p.add_argument("--fleet", required=True, help="the fleet's name (its BrokerFleet)")
    p.add_argument("--out", required=True, help="output folder; files go to OUT/events/date=.../zone=.../")
    p.add_argument("--batch", type=int, default=10_000, help="entries per read and per file set (10000)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="drain the stream, then exit (a CronJob)")
    mode.add_argument("--follow", action="store_true", help="keep exporting as events arrive (the default)")
    p.add_argument(
        "--flush-interval", default="10s", help="follow mode: write at least this often when events trickle"
    )
    p.add_argument("--group", default=DEFAULT_GROUP, help=f"consumer group ({DEFAULT_GROUP})")
    p.add_argument(
        "--consumer",
        default=DEFAULT_CONSUMER,
        help=f"consumer name ({DEFAULT_CONSUMER}); keep it stable so a restart finds its pending entries",
    )
    return p


def export_main(argv: list[str]) -> int:
    from fleetmq.pipeline.export import Exporter, ExportError

    args = export_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        flush = parse_duration(args.flush_interval)
        exporter = Exporter(
            args.redis_url,
            args.fleet,
            args.out,
            group=args.group,
            consumer=args.consumer,
            batch=args.batch,
            flush_interval=flush,
        )
        stats = exporter.run(once=args.once)
    except (ExportError, ValueError) as e:
        print(f"fleetmq-pipeline export: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    summary = asdict(stats)
    summary.pop("paths")
    print(json.dumps(summary))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "export":
        return export_main(rest)
    if command == "report":
        from fleetmq.pipeline.report import main as report_main

        return report_main(rest)
    print(f"fleetmq-pipeline: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
