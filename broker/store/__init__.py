"""The session store: what must outlive a connection, shared by the fleet.

A store keeps what must outlive a connection: offline sessions with their queues.
Its interface is asynchronous and batched from the start: every write of one event-loop turn is handed to
`commit()` as one list, so a Redis store sends it in one round trip (one pipeline / script call) and the
acks that wait for it (publisher confirms) are released together, as RabbitMQ batches fsyncs.

Outcomes. Every call to a store ends in one of three ways: applied; not applied (refused, or never
sent); or unknown: sent, and the connection broke before the reply (Redis shut down, failed over, the
network cut it after the write). A call raising may have applied, so an unknown outcome is never taken
for "not applied": nothing is compensated on its strength (no release, undo or delete written because
of it). Each caller either makes its write idempotent, so that sending it again once the store answers
leaves the state one run would, or reads the outcome back before deciding anything else
(`SessionStore.transient` tells a failure worth sending again from one that would only repeat):

- group commit: a session's journal changes and the routings into other sessions are not sent again;
  the publishers are not acknowledged (they resend, and a resend finds what the first attempt stored:
  a QoS 2 record awaiting PUBREL, in the same transaction as its routing, or a receipt on a Redis
  Cluster) and the sessions read back what the store holds when their clients reconnect (resync).
  Parks, ends, route changes and retained messages are idempotent and go out again until they land.
- claim: carries a token; the same claim sent again gets the same answer. One never answered is read
  back (`claimed`) and what its refused client would leave behind undone (`abandon`).
- pulls: a session whose pull's reply was lost resynchronises (its client resumes from the store,
  which moved the deliveries into the session's journal atomically with the pull).
- wills: taken (`take_will`) and released with a dead node's sessions (`reap`) by token: the same
  taker asking again gets the same answer, any other taker nothing.
- a connected session's will (`set_will`), the re-assertion after an outage, heartbeats, route and
  registry sets: idempotent, sent again as they are.
- bridge leases (bridge.Lease): SET NX whose reply is lost is read back (the holder is this node).
- event-log batches (events.EventLog): idempotent per record (a high-water mark per node run).
"""
