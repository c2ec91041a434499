"""Per-zone, per-window delivery KPIs from the event table, as Spark DataFrame expressions (no UDFs).

Definitions (windows are tumbling, by event time):
- latency: deliver.ts - publish_in.ts of the same msg_id, in the window of the delivery;
- ack round trip: ack.ts - the first deliver.ts of the same (msg_id, client), in the window of the delivery
  (an ack is the PUBACK of QoS 1 or the PUBCOMP of QoS 2: when the inflight slot frees);
- duplicate ratio: retransmits / deliveries; inflight-full ratio: inflight_full / deliveries;
- session rate: a session's deliveries in the window / window seconds; its p95 over sessions;
- inflight utilisation: p95 inflight_len of deliveries / max_inflight (null when 0 = no limit, or unknown);
- queue depth: mqueue_len carried by deliver, inflight_full and drop events;
- offline backlog: mqueue_len of a connect that resumed a session (reason "resumed": what waited for it)
  and of a queue_full drop that carries one (the queue at its limit);
- drops: all of them by reason (eventschema.DropReason); drops_lost only those that lose a message the
  broker had accepted (DropReason.lost), not refused publishes or messages nobody could receive;
- takeovers: counted on the node that got the session (reason local or remote); the old node's
  "handover" record of the same takeover is not counted again.
Sampling undone: a node logs the per-message kinds (publish_in, deliver, ack, retransmit) of a fraction of
the messages, which it lowers under load; its zone_config records carry the fraction in force. Each such
event weighs 1 / the fraction its node last logged for its zone (the zone's latest, or 1, before any), so
publishes, deliveries, acks, retransmits and session rates estimate the real traffic; ``sample`` is the
lowest fraction in force in the window. Other kinds are never sampled and are counted as they are.
Zone limits: the latest zone_config event of each zone, unless ``limits`` (from --config) names the zone.
"""

from __future__ import annotations

from collections.abc import Mapping

from fleetmq.broker.eventschema import BRIDGE_RECONNECT, SAMPLED_EVENTS, DropReason
from fleetmq.pipeline.tuning import P_SIZING, PERCENTILE_ACCURACY, PERCENTILES
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

QUEUE_DEPTH_EVENTS = ("deliver", "inflight_full", "drop")
#: drops that lose a message the broker had accepted, counted apart from refusals and unrouted messages
LOST_REASONS = tuple(r.value for r in DropReason if r.lost)
KEYS = ("zone", "window_start")


def pct(col: Column | str, p: float) -> Column:
    return F.percentile_approx(col, F.lit(p), F.lit(PERCENTILE_ACCURACY))


def _count(event: str) -> Column:
    return F.count(F.when(F.col("event") == event, 1))


def _estimate(event: str) -> Column:
    """How many events of a sampled kind there were: their weights added up."""
    return F.coalesce(F.round(F.sum(F.when(F.col("event") == event, F.col("w")))), F.lit(0)).cast("long")


def weigh(events: DataFrame, settings: DataFrame) -> DataFrame:
    """Add ``rate`` (the sampling fraction the event's node had in force for its zone) and ``w`` (1 / rate
    for the sampled kinds, 1 otherwise); zone_config rows are left out."""
    in_force = (
        Window.partitionBy("node", "zone")
        .orderBy("ts_ms")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    logged = F.last(F.when(F.col("event") == "zone_config", F.col("sample")), ignorenulls=True).over(in_force)
    rate = F.coalesce(F.col("logged"), F.col("zone_sample"), F.lit(1.0))
    sampled = F.col("event").isin(*sorted(SAMPLED_EVENTS))
    return (
        events.withColumn("logged", logged)
        .where(F.col("event") != "zone_config")
        .join(F.broadcast(settings.select("zone", F.col("sample").alias("zone_sample"))), "zone", "left")
        .withColumn("rate", F.when(sampled, rate))
        .withColumn("w", F.when(sampled & (F.col("rate") > 0), 1.0 / F.col("rate")).otherwise(1.0))
        .drop("logged", "zone_sample")
    )


def prepare(events: DataFrame, window: str) -> DataFrame:
    """Drop duplicate eids (an older broker's resend, an exporter's rewrite) and add the event's window."""
    w = F.window(F.timestamp_millis(F.col("ts_ms").cast("long")), window)
    return (
        events.dropDuplicates(["eid"])
        .withColumn("window_start", w.start)
        .withColumn("window_end", w.end)
        .withColumn("ts", F.col("ts_ms"))
    )


def zone_limits(
    events: DataFrame, limits: Mapping[str, tuple[int | None, int | None]] | None = None
) -> DataFrame:
    """zone, max_inflight, max_mqueue_len, sample: the latest zone_config of each zone, then ``limits``."""
    spark = events.sparkSession
    from_events = (
        events.where(F.col("event") == "zone_config")
        .groupBy("zone")
        .agg(
            F.max_by(F.struct("max_inflight", "max_mqueue_len", "sample"), F.col("ts_ms")).alias("c"),
        )
        .select("zone", "c.max_inflight", "c.max_mqueue_len", "c.sample")
    )
    if not limits:
        return from_events
    given = spark.createDataFrame(
        [(z, mi, mq) for z, (mi, mq) in limits.items()],
        "zone string, max_inflight_cfg bigint, max_mqueue_len_cfg bigint",
    )
    return from_events.join(given, "zone", "full_outer").select(
        "zone",
        F.coalesce("max_inflight_cfg", "max_inflight").alias("max_inflight"),
        F.coalesce("max_mqueue_len_cfg", "max_mqueue_len").alias("max_mqueue_len"),
        "sample",
    )


def zone_kpis(
    events: DataFrame,
    window: str = "5 minutes",
    limits: Mapping[str, tuple[int | None, int | None]] | None = None,
) -> DataFrame:
    """One row per (zone, window) with events; see the module docstring for each column."""
    settings = zone_limits(events, limits)
    ev = weigh(prepare(events, window), settings)
    window_s = (F.col("window_end").cast("long") - F.col("window_start").cast("long")).cast("double")

    counts = ev.groupBy(*KEYS).agg(
        F.first("window_end").alias("window_end"),
        _estimate("publish_in").alias("publishes"),
        _estimate("deliver").alias("deliveries"),
        _estimate("ack").alias("acks"),
        _estimate("retransmit").alias("retransmits"),
        F.min("rate").alias("window_sample"),
        _count("drop").alias("drops_total"),
        F.count(F.when((F.col("event") == "drop") & F.col("reason").isin(*LOST_REASONS), 1)).alias(
            "drops_lost"
        ),
        _count("inflight_full").alias("inflight_full"),
        F.count(
            F.when((F.col("event") == "takeover") & (F.coalesce(F.col("reason"), F.lit("")) != "handover"), 1)
        ).alias("takeovers"),
        _count("keepalive_timeout").alias("keepalive_timeouts"),
        _count("connect").alias("connects"),
        _count("disconnect").alias("disconnects"),
        F.count_distinct(F.when(F.col("event") == "deliver", F.col("client"))).alias("sessions"),
        pct(F.when(F.col("event") == "deliver", F.col("inflight_len")), P_SIZING).alias("inflight_p95"),
        *[
            pct(F.when(F.col("event").isin(*QUEUE_DEPTH_EVENTS), F.col("mqueue_len")), p).alias(
                f"queue_depth_{n}"
            )
            for n, p in PERCENTILES.items()
        ],
        *[
            pct(
                F.when(
                    ((F.col("event") == "connect") & (F.col("reason") == "resumed"))
                    | ((F.col("event") == "drop") & (F.col("reason") == "queue_full")),
                    F.col("mqueue_len"),
                ),
                p,
            ).alias(f"offline_backlog_{n}")
            for n, p in PERCENTILES.items()
        ],
    )

    drops = (
        ev.where(F.col("event") == "drop")
        .groupBy(*KEYS, F.coalesce(F.col("reason"), F.lit("unknown")).alias("reason"))
        .count()
        .groupBy(*KEYS)
        .agg(F.map_from_entries(F.sort_array(F.collect_list(F.struct("reason", "count")))).alias("drops"))
    )

    reconnects = (
        ev.where(F.col("event") == BRIDGE_RECONNECT)
        .groupBy(*KEYS, F.coalesce(F.col("reason"), F.lit("unknown")).alias("reason"))
        .count()
        .groupBy(*KEYS)
        .agg(
            F.map_from_entries(F.sort_array(F.collect_list(F.struct("reason", "count")))).alias(
                "bridge_reconnects"
            )
        )
    )

    published = (
        ev.where((F.col("event") == "publish_in") & F.col("msg_id").isNotNull())
        .groupBy("msg_id")
        .agg(F.min("ts").alias("published"))
    )
    delivered = ev.where((F.col("event") == "deliver") & F.col("msg_id").isNotNull())
    latency = (
        delivered.join(published, "msg_id")
        .withColumn("latency_ms", F.col("ts") - F.col("published"))
        .groupBy(*KEYS)
        .agg(*[pct("latency_ms", p).alias(f"latency_{n}_ms") for n, p in PERCENTILES.items()])
    )

    first_delivery = delivered.groupBy("msg_id", "client").agg(
        F.min_by(F.struct("zone", "window_start"), F.col("ts")).alias("d"), F.min("ts").alias("delivered")
    )
    acked = (
        ev.where((F.col("event") == "ack") & F.col("msg_id").isNotNull())
        .groupBy("msg_id", "client")
        .agg(F.min("ts").alias("acked"))
    )
    rtt = (
        first_delivery.join(acked, ["msg_id", "client"])
        .select("d.zone", "d.window_start", (F.col("acked") - F.col("delivered")).alias("rtt_ms"))
        .groupBy(*KEYS)
        .agg(pct("rtt_ms", P_SIZING).alias("ack_rtt_p95_ms"))
    )

    per_session = (
        delivered.groupBy(*KEYS, "client", "window_end")
        .agg((F.sum("w") / window_s).alias("session_rate"))
        .groupBy(*KEYS)
        .agg(pct("session_rate", P_SIZING).alias("session_rate_p95"))
    )

    def ratio(num: str, den: str) -> Column:
        return F.when(F.col(den) > 0, F.col(num) / F.col(den))

    return (
        counts.join(latency, list(KEYS), "left")
        .join(rtt, list(KEYS), "left")
        .join(per_session, list(KEYS), "left")
        .join(drops, list(KEYS), "left")
        .join(reconnects, list(KEYS), "left")
        .join(settings, "zone", "left")
        .select(
            "zone",
            "window_start",
            "window_end",
            F.to_date("window_start").alias("date"),
            "publishes",
            "deliveries",
            "acks",
            "retransmits",
            ratio("retransmits", "deliveries").alias("duplicate_ratio"),
            *[f"latency_{n}_ms" for n in PERCENTILES],
            "ack_rtt_p95_ms",
            "sessions",
            "session_rate_p95",
            "inflight_p95",
            "max_inflight",
            ratio("inflight_p95", "max_inflight").alias("inflight_utilisation_p95"),
            "inflight_full",
            ratio("inflight_full", "deliveries").alias("inflight_full_ratio"),
            *[f"queue_depth_{n}" for n in PERCENTILES],
            *[f"offline_backlog_{n}" for n in PERCENTILES],
            "max_mqueue_len",
            "drops_total",
            "drops_lost",
            F.coalesce("drops", F.create_map().cast("map<string,bigint>")).alias("drops"),
            F.coalesce("bridge_reconnects", F.create_map().cast("map<string,bigint>")).alias(
                "bridge_reconnects"
            ),
            "takeovers",
            "keepalive_timeouts",
            "connects",
            "disconnects",
            F.coalesce("window_sample", "sample", F.lit(1.0)).alias("sample"),
        )
    )
