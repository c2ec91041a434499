"""The Spark job: event Parquet files in, zone KPIs, recommendations, a report and an MqttZone patch out.

Runs in-process (``fleetmq-pipeline report``, local mode unless --master) or under spark-submit, which
runs this file: ``spark-submit --master spark://host:7077 $(python -c 'import fleetmq.pipeline.report as
m; print(m.__file__)') --in DIR --out DIR``. Only the driver needs fleetmq (no UDFs); --in and --out must
be paths every executor sees (a shared file system or an object store).

Outputs under --out: ``zone_kpis/`` (Parquet, partitioned by date), ``zone_recommendations/`` (Parquet),
``report.md`` with ``plots/*.png``, and ``mqttzone-patch.yaml``.

--incremental reads the events folder as a file stream (trigger availableNow, progress in --checkpoint):
each run handles only files it has not seen, recomputes the KPIs of the days they touch (and the days
next to them, for deliveries and acks that cross midnight) and replaces those days' zone_kpis partitions;
recommendations and the report are then rebuilt from the whole zone_kpis table. A delivery whose
publish_in is more than a day older is left out of the latency in this mode.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import shutil
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml
from fleetmq.broker.zones import format_duration, parse_duration
from fleetmq.pipeline import render
from fleetmq.pipeline.schema import EVENTS_DIR, spark_schema
from fleetmq.pipeline.tuning import Recommendation, WindowKpi, recommend_zone

log = logging.getLogger("fleetmq.pipeline.report")

KPIS_DIR = "zone_kpis"
RECOMMENDATIONS_DIR = "zone_recommendations"
REPORT_FILE = "report.md"
PATCH_FILE = "mqttzone-patch.yaml"
PLOTS_DIR = "plots"
Limits = dict[str, tuple[int | None, int | None]]


class ReportError(Exception):
    """The job cannot run on this input (no events, unreadable --config, bad --window)."""


def window_spec(text: str) -> str:
    """'5m' -> '300 seconds' (Spark's window duration), refusing what is not a positive duration."""
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise ReportError(f"--window: {e}") from e
    if seconds < 1 or seconds != int(seconds):
        raise ReportError(f"--window must be a whole number of seconds >= 1, got {text!r}")
    return f"{int(seconds)} seconds"


def load_limits(path: str | Path) -> Limits:
    """Zone limits from a broker config file (zones:) or MqttZone manifests (one or more YAML documents)."""
    from fleetmq.broker.config import ConfigError, load_config

    try:
        docs = [d for d in yaml.safe_load_all(Path(path).read_text()) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise ReportError(f"--config {path}: {e}") from e
    if docs and all(isinstance(d, dict) and d.get("kind") == "MqttZone" for d in docs):
        limits: Limits = {}
        for i, d in enumerate(docs):
            name = (d.get("metadata") or {}).get("name")
            if not name:
                raise ReportError(f"--config {path}: MqttZone document {i} has no metadata.name")
            session = (d.get("spec") or {}).get("session") or {}
            limits[name] = (session.get("maxInflight"), session.get("maxMqueueLen"))
        return limits
    try:
        config = load_config(path)
    except ConfigError as e:
        raise ReportError(
            f"--config {path} is neither MqttZone manifests nor a valid broker config: {e}"
        ) from e
    return {name: (z.max_inflight, z.max_mqueue_len) for name, z in config.zones.items()}


def spark_session(master: str | None, app: str = "fleetmq-report") -> Any:
    """A session in UTC (windows and date partitions are UTC days); local[*] unless a master is given here
    or by spark-submit."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:  # embedded (tests, a notebook): use it as configured, in UTC
        active.conf.set("spark.sql.session.timeZone", "UTC")
        return active
    builder = SparkSession.builder.appName(app).config("spark.sql.session.timeZone", "UTC")
    if master:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):
        builder = builder.master("local[*]")
    if (master or "local").startswith("local"):
        builder = (
            builder.config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
        )
    spark = builder.getOrCreate()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


def _events_dir(in_dir: str | Path) -> str:
    return f"{str(in_dir).rstrip('/')}/{EVENTS_DIR}"


def check_events(in_dir: str | Path) -> None:
    """Fail early, with the hint, when a local input folder holds no exported events."""
    path = _events_dir(in_dir)
    if "://" not in path and not any(Path(path).glob("date=*/zone=*/*.parquet")):
        raise ReportError(f"no events under {path}: run `fleetmq-pipeline export --out {in_dir}` first")


def read_events(spark: Any, in_dir: str | Path, dates: list[str] | None = None) -> Any:
    from pyspark.sql import functions as F

    path = _events_dir(in_dir)
    check_events(in_dir)
    df = spark.read.schema(spark_schema()).option("basePath", path).parquet(path)
    return df.where(F.col("date").isin(dates)) if dates is not None else df


def run(
    spark: Any,
    in_dir: str | Path,
    out_dir: str | Path,
    *,
    window: str = "5m",
    limits: Limits | None = None,
    incremental: bool = False,
    checkpoint: str | Path | None = None,
    report_dir: str | Path | None = None,
) -> list[Recommendation]:
    """The whole job; returns the recommendations it wrote. report.md, plots and the patch go to
    ``report_dir`` (default: out_dir when it is a local path, else ./fleetmq-report)."""
    from fleetmq.pipeline.kpis import zone_kpis

    spec = window_spec(window)
    out = str(out_dir).rstrip("/")
    kpis_path = f"{out}/{KPIS_DIR}"
    if not incremental:
        kpis = zone_kpis(read_events(spark, in_dir), spec, limits)
        kpis.write.mode("overwrite").partitionBy("date").parquet(kpis_path)
    else:
        if checkpoint is None:
            raise ReportError("--incremental needs --checkpoint DIR (where the stream remembers its files)")
        _run_incremental(spark, in_dir, kpis_path, spec, limits, str(checkpoint))
    return finish(spark, out, window=format_duration(parse_duration(window)), report_dir=report_dir)


def _run_incremental(
    spark: Any, in_dir: str | Path, kpis_path: str, spec: str, limits: Limits | None, checkpoint: str
) -> None:
    from fleetmq.pipeline.kpis import zone_kpis

    check_events(in_dir)
    stream = spark.readStream.schema(spark_schema()).parquet(_events_dir(in_dir))

    def process(batch: Any, batch_id: int) -> None:
        new = {r["date"] for r in batch.select("date").distinct().collect() if r["date"]}
        if not new:
            return
        touched = {_shift(d, k) for d in new for k in (-1, 0, 1)}
        read = sorted({_shift(d, k) for d in touched for k in (-1, 0, 1)})
        kpis = zone_kpis(read_events(spark, in_dir, dates=read), spec, limits)
        from pyspark.sql import functions as F

        kpis = kpis.where(F.col("date").isin([dt.date.fromisoformat(d) for d in sorted(touched)]))
        spark.conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
        try:
            kpis.write.mode("overwrite").partitionBy("date").parquet(kpis_path)
        finally:
            spark.conf.unset("spark.sql.sources.partitionOverwriteMode")
        log.info("batch %d: files of %s, zone_kpis of %s rewritten", batch_id, sorted(new), sorted(touched))

    query = (
        stream.writeStream.foreachBatch(process)
        .trigger(availableNow=True)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    query.awaitTermination()


def _shift(date: str, days: int) -> str:
    return (dt.date.fromisoformat(date) + dt.timedelta(days=days)).isoformat()


def finish(
    spark: Any, out: str, *, window: str, report_dir: str | Path | None = None
) -> list[Recommendation]:
    """Recommendations, report, plots and patch from the whole zone_kpis table."""
    from pyspark.errors import AnalysisException

    try:
        rows = [r.asDict(recursive=True) for r in spark.read.parquet(f"{out}/{KPIS_DIR}").collect()]
    except AnalysisException:  # no (zone, window) had an event besides zone_config: no files to read
        rows = []
    recs = recommendations(rows)
    rec_schema = "zone string, setting string, current bigint, recommended bigint, reason string, window_start timestamp"
    spark.createDataFrame(
        [(r.zone, r.setting, r.current, r.recommended, r.reason, r.window_start) for r in recs], rec_schema
    ).coalesce(1).write.mode("overwrite").parquet(f"{out}/{RECOMMENDATIONS_DIR}")
    # the report files go to a local folder; the Parquet tables may live anywhere (s3a://, hdfs://)
    folder = Path(report_dir or (out if "://" not in out else "fleetmq-report"))
    folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(folder / PLOTS_DIR, ignore_errors=True)
    plots = render.plot_zones(rows, folder / PLOTS_DIR) if rows else {}
    (folder / REPORT_FILE).write_text(render.markdown(rows, recs, window=window, plots=plots))
    (folder / PATCH_FILE).write_text(render.mqttzone_patch(recs))
    return recs


def recommendations(rows: list[dict[str, Any]]) -> list[Recommendation]:
    """tuning.recommend_zone over each zone's windows, with the zone's latest known limits as current."""
    zones: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        zones[r["zone"]].append(r)
    recs: list[Recommendation] = []
    for zone in sorted(zones, key=str):
        zrows = sorted(zones[zone], key=lambda r: r["window_start"])
        windows = [
            WindowKpi(
                r["window_start"],
                r["session_rate_p95"],
                r["ack_rtt_p95_ms"],
                r["offline_backlog_p99"],
                (r["drops"] or {}).get("queue_full", 0),
                r["inflight_full"],
            )
            for r in zrows
        ]
        last = zrows[-1]
        recs += recommend_zone(zone, windows, last["max_inflight"], last["max_mqueue_len"])
    return recs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetmq-pipeline report", description="Zone KPIs and recommended settings from exported events."
    )
    p.add_argument("--in", dest="in_dir", required=True, help="the exporter's --out folder (holds events/)")
    p.add_argument("--out", dest="out_dir", required=True, help="where tables, report and patch go")
    p.add_argument("--window", default="5m", help="KPI window length (30s, 5m, 1h; default 5m)")
    p.add_argument(
        "--config",
        help="zone limits (max_inflight, max_mqueue_len): a broker config file or MqttZone manifests; "
        "overrides the limits the brokers logged (zone_config events)",
    )
    p.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    p.add_argument("--incremental", action="store_true", help="only new event files (a file stream)")
    p.add_argument("--checkpoint", help="the stream's progress folder (with --incremental)")
    p.add_argument(
        "--report-dir", help="local folder for report.md, plots and the patch (default: --out if local)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        window_spec(args.window)
        limits = load_limits(args.config) if args.config else None
        check_events(args.in_dir)
        if args.incremental and not args.checkpoint:
            raise ReportError("--incremental needs --checkpoint DIR (where the stream remembers its files)")
        spark = spark_session(args.master)
        recs = run(
            spark,
            args.in_dir,
            args.out_dir,
            window=args.window,
            limits=limits,
            incremental=args.incremental,
            checkpoint=args.checkpoint,
            report_dir=args.report_dir,
        )
    except ReportError as e:
        print(f"fleetmq-pipeline report: {e}", file=sys.stderr)
        return 2
    for rec in recs:
        print(f"{rec.zone}.{rec.setting}: {rec.current} -> {rec.recommended} ({rec.reason})")
    folder = args.report_dir or (args.out_dir if "://" not in args.out_dir else "fleetmq-report")
    print(f"report: {Path(folder) / REPORT_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
