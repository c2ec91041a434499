"""A deliberately broken fleet: an MQTT relay in front of each node that loses, duplicates and reorders.

`python -m chaos --broken relay` puts one in front of every node (clients connect to the relays) so the
checker can be shown to catch each violation class on real sockets, and to count exactly what was done:
- lose: a QoS 1 PUBLISH to a client is swallowed and PUBACKed to the broker by the relay;
- duplicate: the client's PUBREC for a QoS 2 PUBLISH is swallowed and answered with a PUBREL by the
  relay; after the client's PUBCOMP the relay cuts the connection, so the broker, which never saw the
  PUBREC, resends the PUBLISH on the next connection and the client (rightly) takes it as new;
- reorder: a PUBLISH is held back and sent right after the next PUBLISH on the same topic.
Each happens with a small seeded probability, up to `limit` times per kind across the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import struct
from collections.abc import Callable

from chaos import codec
from chaos.procs import HOST, free_port


class _Budget:
    def __init__(self, limit: int):
        self.limit = limit
        self.done = {"lost": 0, "duplicated": 0, "reordered": 0}

    def take(self, kind: str) -> bool:
        if self.done[kind] >= self.limit:
            return False
        self.done[kind] += 1
        return True


class _Session:
    """One client connection through the relay."""

    def __init__(
        self,
        relay: Relay,
        cr: asyncio.StreamReader,
        cw: asyncio.StreamWriter,
        ur: asyncio.StreamReader,
        uw: asyncio.StreamWriter,
    ):
        self.relay, self.cr, self.cw, self.ur, self.uw = relay, cr, cw, ur, uw
        self.stolen: set[int] = set()  # QoS 2 ids whose PUBREC the relay answers itself
        self.held: tuple[bytes, bytes] | None = None  # (topic, frame) held back
        self.closed = False

    async def run(self) -> None:
        await asyncio.gather(self._pump(self.ur, self._from_broker), self._pump(self.cr, self._from_client))

    async def _pump(self, r: asyncio.StreamReader, handle: Callable[[int, int, bytes], None]) -> None:
        buf = bytearray()
        try:
            while not self.closed:
                chunk = await r.read(65536)
                if not chunk:
                    break
                buf += chunk
                while (framed := codec.split(buf)) is not None:
                    handle(*framed)
                for w in (self.cw, self.uw):
                    await w.drain()
        except (OSError, ConnectionError, codec.MalformedError):
            pass
        self.close()

    def _from_broker(self, type_: int, flags: int, body: bytes) -> None:
        raw = codec.frame(type_, flags, body)
        if type_ != codec.PUBLISH:
            self.cw.write(raw)
            return
        rng, budget = self.relay.rng, self.relay.budget
        qos, dup = (flags >> 1) & 3, bool(flags & 0x08)
        n = struct.unpack("!H", body[:2])[0]
        topic = body[2 : 2 + n]
        pid = struct.unpack("!H", body[2 + n : 4 + n])[0] if qos else 0
        if self.held is not None and self.held[0] == topic:
            self.cw.write(raw + self.held[1])  # the later one first
            self.held = None
            return
        roll = rng.random()
        p = self.relay.p
        if not dup and qos == 1 and roll < p and budget.take("lost"):
            self.uw.write(codec.ack(codec.PUBACK, pid))
            return
        if not dup and qos == 2 and p <= roll < 2 * p and budget.take("duplicated"):
            self.stolen.add(pid)
        elif not dup and self.held is None and 2 * p <= roll < 3 * p and budget.take("reordered"):
            self.held = (topic, raw)
            return
        self.cw.write(raw)

    def _from_client(self, type_: int, flags: int, body: bytes) -> None:
        raw = codec.frame(type_, flags, body)
        pid = struct.unpack("!H", body[:2])[0] if type_ in (codec.PUBREC, codec.PUBCOMP) else 0
        if type_ == codec.PUBREC and pid in self.stolen:
            self.cw.write(codec.ack(codec.PUBREL, pid))
            return
        if type_ == codec.PUBCOMP and pid in self.stolen:
            # the client has the message and forgot its id; the broker will send it again
            self.stolen.discard(pid)
            self.close()
            return
        self.uw.write(raw)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        # what was decided but not done does not count
        self.relay.budget.done["duplicated"] -= len(self.stolen)
        self.relay.budget.done["reordered"] -= self.held is not None
        for w in (self.cw, self.uw):
            with contextlib.suppress(Exception):
                w.transport.abort()


class Relay:
    """Listens on a free port and relays to one node's MQTT port, misbehaving as described above."""

    def __init__(self, name: str, upstream_port: int, rng: random.Random, budget: _Budget, p: float):
        self.name, self.upstream_port, self.rng, self.budget, self.p = name, upstream_port, rng, budget, p
        self.port = free_port()
        self.sessions: set[_Session] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, HOST, self.port)

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.wait_for(asyncio.open_connection(HOST, self.upstream_port), 5)
        except (OSError, TimeoutError):
            cw.transport.abort()
            return
        s = _Session(self, cr, cw, ur, uw)
        self.sessions.add(s)
        try:
            await s.run()
        finally:
            self.sessions.discard(s)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for s in list(self.sessions):
            s.close()


def make_relays(
    names_ports: list[tuple[str, int]], seed: int, p: float = 0.01, limit: int = 10
) -> list[Relay]:
    """One relay per node, sharing one budget so the whole fleet does at most `limit` of each."""
    budget = _Budget(limit)
    return [
        Relay(f"{name}-relay", port, random.Random(f"relay:{seed}:{name}"), budget, p)
        for name, port in names_ports
    ]
