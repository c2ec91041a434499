"""An asyncio MQTT client that behaves as a careful real client must across faults.

Each client owns one persistent session (MQTT 3.1.1 clean session 0, or MQTT 5 clean start 0 with a
session expiry) and keeps its side of it across connections, as the specification requires:
- unacknowledged PUBLISH (DUP set) and PUBREL are resent after a reconnect that finds the session
  present, in their original order and with their original packet ids;
- as a QoS 2 receiver it remembers the packet ids awaiting PUBREL, so a resent PUBLISH is acknowledged
  but not handed to the application twice (exactly once is then the broker's job, and checkable);
- after a disconnect it reconnects to a random live node, and the nemesis can force a takeover (a new
  connection to another node while the old one is still open, as a client behind a NAT would).
Everything it sees goes into the run's History.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from chaos import codec
from chaos.history import Conn, Delivery, History, MsgKey, SubInfo, parse_payload, payload_of

CONNECT_TIMEOUT = 5.0
LINGER = 10.0  # how long an abandoned connection is watched for the broker to close it

NodePicker = Callable[[random.Random, str | None], tuple[str, str, int] | None]


class _Link:
    """One TCP connection to one node, with a reader that frames packets."""

    def __init__(self, node: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int):
        self.node, self.reader, self.writer, self.version = node, reader, writer, version
        self.buf = bytearray()
        self.closed = False
        self.last_recv = asyncio.get_running_loop().time()
        self.conn: Conn | None = None

    async def read(self) -> codec.Packet | None:
        """The next packet, or None at EOF / connection error."""
        while True:
            framed = codec.split(self.buf)
            if framed is not None:
                self.last_recv = asyncio.get_running_loop().time()
                return codec.decode(*framed, self.version)
            try:
                chunk = await self.reader.read(65536)
            except (ConnectionError, OSError):
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk

    def write(self, data: bytes) -> None:
        if not self.closed and not self.writer.is_closing():
            self.writer.write(data)

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            self.writer.close()


@dataclass
class _Out:
    """An outgoing QoS 1/2 message in flight: its packet id, and for QoS 2 whether PUBREC came."""

    key: MsgKey
    qos: int
    payload: bytes
    released: bool = False  # QoS 2: PUBREC received, PUBREL sent, waiting for PUBCOMP


class Client:
    """The shared part of publishers and subscribers: sessions, connections, keep alive, takeover."""

    def __init__(
        self,
        cid: str,
        version: int,
        history: History,
        pick: NodePicker,
        rng: random.Random,
        *,
        keepalive: int = 5,
        session_expiry: int = 3600,
        username: str | None = None,
    ):
        self.cid, self.version, self.history, self.pick, self.rng = cid, version, history, pick, rng
        self.keepalive, self.session_expiry, self.username = keepalive, session_expiry, username
        self.out: dict[int, _Out] = {}  # packet id -> in flight, in the order first sent
        self.awaiting_rel: set[int] = set()  # incoming QoS 2 ids awaiting PUBREL
        self.has_session = False  # a CONNACK accepted us once: the broker must keep our session
        self.link: _Link | None = None
        self.node: str | None = None
        self.stopping = False
        self._wake = asyncio.Event()  # a takeover request or stop
        self._room = asyncio.Event()  # room in the publisher's window, or a message to send
        self._takeover: str | None = None
        self._reconnect = False
        self._next_pid = 0
        self._conns = 0
        self._receive_maximum = 65535
        self._link_keepalive = keepalive
        self.connected = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- control (nemesis, runner)
    def take_over(self, node: str) -> bool:
        """Reconnect to `node` now, leaving the current connection open (the broker must close it)."""
        if self.link is None or self.stopping or node == self.node:
            return False
        self._takeover = node
        self._wake.set()
        return True

    def reconnect(self) -> None:
        """Close the connection and connect again to a random live node (the old one included)."""
        if self.link is not None:
            self._reconnect = True
            self._wake.set()

    def stop(self) -> None:
        self.stopping = True
        self._wake.set()

    # -- the life of the client
    async def run(self) -> None:
        backoff = 0.1
        while not self.stopping:
            target, self._takeover = self._takeover, None
            picked = self.pick(self.rng, target)  # the takeover's node if it is live, else any live one
            if picked is None:
                await asyncio.sleep(0.2)
                continue
            link = await self._open(*picked)
            if link is None:
                await asyncio.sleep(backoff * (0.5 + self.rng.random()))
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            await self._serve(link)

    async def _open(self, node: str, host: str, port: int) -> _Link | None:
        t_connect = self.history.now()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), CONNECT_TIMEOUT)
        except (OSError, TimeoutError):
            return None
        link = _Link(node, reader, writer, self.version)
        link.write(
            codec.connect(
                self.cid,
                version=self.version,
                clean=False,
                keepalive=self.keepalive,
                username=self.username,
                props={"session_expiry_interval": self.session_expiry} if self.session_expiry else None,
            )
        )
        try:
            ack = await asyncio.wait_for(link.read(), CONNECT_TIMEOUT)
        except (TimeoutError, codec.MalformedError):
            ack = None
        if ack is None or ack.type != codec.CONNACK:
            link.close()
            return None
        self._conns += 1
        conn = Conn(
            self.cid, self._conns, node, t_connect, self.history.now(), ack.reason, ack.session_present
        )
        self.history.conns.append(conn)
        if ack.reason != 0:
            self.history.refusals.append((self.cid, node, ack.reason, conn.t_connack))
            conn.t_closed, conn.cause = conn.t_connack, f"refused 0x{ack.reason:02x}"
            link.close()
            return None
        link.conn = conn
        if self.has_session and not ack.session_present:
            # the broker lost a session it had accepted with an expiry: the spec makes the client drop
            # its own state too; in-flight messages are published again as new ones
            self.history.session_lost.append((self.cid, conn.t_connack, node))
            self._session_lost()
        self.has_session = True
        self._receive_maximum = int(ack.props.get("receive_maximum", 65535))
        keepalive = ack.props.get("server_keep_alive")
        self._link_keepalive = int(keepalive) if keepalive else self.keepalive
        return link

    async def _serve(self, link: _Link) -> None:
        self.link, self.node = link, link.node
        assert link.conn is not None
        cause = "error"
        try:
            for pid, o in list(self.out.items()):  # resend in original order, original packet ids
                if o.released:
                    link.write(codec.ack(codec.PUBREL, pid))
                else:
                    link.write(
                        codec.publish(
                            o.key[1], o.payload, qos=o.qos, packet_id=pid, dup=True, version=self.version
                        )
                    )
                    self.history.sent(*o.key, o.qos, link.node)
            await self.on_connected(link)
            self.connected.set()
            cause = await self._pump(link)
        except codec.MalformedError as e:
            self.history.corrupt.append(
                (self.cid, self.history.now(), f"protocol error from {link.node}: {e}")
            )
            cause = "protocol-error"
        finally:
            self.connected.clear()
            self.link = None
            link.conn.t_closed, link.conn.cause = self.history.now(), cause
            if cause == "takeover":
                self._spawn(self._linger(link))
            elif cause == "stop":
                link.write(codec.disconnect(version=self.version))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(link.writer.drain(), 1.0)
                link.close()
            else:
                link.close()

    async def _pump(self, link: _Link) -> str:
        """Read and answer packets, keep the connection alive, let the subclass send; return why it ended."""
        loop = asyncio.get_running_loop()
        reader = asyncio.ensure_future(link.read())
        sender = asyncio.ensure_future(self.send_loop(link))
        try:
            while True:
                if self.stopping:
                    return "stop"
                if self._takeover is not None:
                    return "takeover"
                if self._reconnect:
                    self._reconnect = False
                    return "reconnect"
                self._wake.clear()
                waker = asyncio.ensure_future(self._wake.wait())
                done, _ = await asyncio.wait(
                    {reader, waker, sender},
                    timeout=self._link_keepalive / 2,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waker.cancel()
                if sender in done:
                    sender.result()  # re-raise its error
                    sender = asyncio.ensure_future(self.send_loop(link))
                if reader in done:
                    pkt = reader.result()
                    if pkt is None:
                        return "eof"
                    self.handle(link, pkt)
                    reader = asyncio.ensure_future(link.read())
                    continue
                if loop.time() - link.last_recv > self._link_keepalive * 1.5:
                    return "keepalive"
                if not done:
                    link.write(codec.pingreq())
        finally:
            for t in (reader, sender):
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t

    async def _linger(self, link: _Link) -> None:
        """Watch a connection the client left for another node: the broker should close it (v5: 0x8E)."""
        t_left = self.history.now()
        reason = None
        closed = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    pkt = await asyncio.wait_for(link.read(), left)
                except TimeoutError:
                    break
                except codec.MalformedError:
                    continue
                if pkt is None:
                    closed = self.history.now()
                    break
                if pkt.type == codec.DISCONNECT:
                    reason = pkt.reason
        finally:
            link.close()
            self.history.lingering.append((self.cid, link.node, t_left, closed, reason))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
            with contextlib.suppress(BaseException):
                await t

    def next_pid(self) -> int:
        for _ in range(65535):
            self._next_pid = self._next_pid % 65535 + 1
            if self._next_pid not in self.out:
                return self._next_pid
        raise RuntimeError("no free packet id")

    # -- subclass hooks
    async def on_connected(self, link: _Link) -> None:
        return None

    async def send_loop(self, link: _Link) -> None:
        await asyncio.Event().wait()

    def handle(self, link: _Link, pkt: codec.Packet) -> None:
        if pkt.type == codec.DISCONNECT:
            self.history.notes.append(
                f"{self.history.now():.3f} {self.cid}: DISCONNECT 0x{pkt.reason:02x} from {link.node}"
            )
        elif pkt.type not in (codec.PINGRESP,):
            self.unexpected(link, pkt)

    def unexpected(self, link: _Link, pkt: codec.Packet) -> None:
        self.history.corrupt.append(
            (self.cid, self.history.now(), f"unexpected {pkt.name} (id {pkt.packet_id}) from {link.node}")
        )

    def _session_lost(self) -> None:
        self.awaiting_rel.clear()


class Publisher(Client):
    """Publishes `rate` messages a second at one QoS, round robin over its topics, each topic numbered
    from 0; at most `window` in flight (and never more than the broker's Receive Maximum)."""

    def __init__(self, *args: Any, qos: int, topics: list[str], rate: float, window: int = 8, **kw: Any):
        super().__init__(*args, **kw)
        self.qos, self.topics, self.rate, self.window = qos, topics, rate, window
        self.pending: collections.deque[tuple[MsgKey, bytes]] = collections.deque()
        self.seqs = dict.fromkeys(topics, 0)
        self._made = 0
        self.producing = True

    async def produce(self) -> None:
        """Make messages at the rate; while the fleet cannot take them, make no more than a window's worth."""
        while self.producing and not self.stopping:
            if len(self.pending) < self.window:
                self._make()
                self._room.set()
            await asyncio.sleep(1.0 / self.rate)

    def _make(self) -> None:
        topic = self.topics[self._made % len(self.topics)]
        self._made += 1
        seq = self.seqs[topic]
        self.seqs[topic] = seq + 1
        key = (self.cid, topic, seq)
        self.pending.append((key, payload_of(*key, pad=16)))

    def burst(self, n: int) -> int:
        """Queue `n` messages at once (at most what the window has room for now), so that the send loop
        writes them back to back and they are in flight together; returns how many. Nothing while the
        producer is stopped (draining) or the client is not connected."""
        if not self.producing or self.stopping or self.link is None:
            return 0
        n = max(0, min(n, min(self.window, self._receive_maximum) - len(self.out) - len(self.pending)))
        for _ in range(n):
            self._make()
        if n:
            self._room.set()
        return n

    def idle(self) -> bool:
        return not self.pending and not self.out

    async def send_loop(self, link: _Link) -> None:
        while True:
            room = min(self.window, self._receive_maximum) - len(self.out)
            if room <= 0 or not self.pending:
                await self._room.wait()
                self._room.clear()
                continue
            key, payload = self.pending.popleft()
            pid = self.next_pid()
            self.out[pid] = _Out(key, self.qos, payload)
            self.history.sent(*key, self.qos, link.node)
            link.write(codec.publish(key[1], payload, qos=self.qos, packet_id=pid, version=self.version))
            await asyncio.sleep(0)

    def handle(self, link: _Link, pkt: codec.Packet) -> None:
        o = self.out.get(pkt.packet_id)
        if pkt.type == codec.PUBACK:
            if o is None or o.qos != 1:
                return self.unexpected(link, pkt)
            del self.out[pkt.packet_id]
            self._ack(o, pkt, link)
        elif pkt.type == codec.PUBREC:
            if o is None or o.qos != 2:
                return self.unexpected(link, pkt)
            if not o.released:
                if pkt.reason >= 0x80:
                    del self.out[pkt.packet_id]
                    return self._ack(o, pkt, link)
                self._ack(o, pkt, link)
                o.released = True
            link.write(codec.ack(codec.PUBREL, pkt.packet_id))
        elif pkt.type == codec.PUBCOMP:
            if o is None or not o.released:
                return self.unexpected(link, pkt)
            del self.out[pkt.packet_id]
            self._room.set()
        else:
            super().handle(link, pkt)

    def _ack(self, o: _Out, pkt: codec.Packet, link: _Link) -> None:
        if pkt.reason >= 0x80:  # refused (v5): the message is not the broker's; send it again later
            self.history.refused(o.key)
            self.pending.appendleft((o.key, o.payload))
        else:
            self.history.acked(o.key, link.node)
        self._room.set()

    def _session_lost(self) -> None:
        super()._session_lost()
        # what the lost session held is published again as new messages (a released QoS 2 message
        # was already the broker's)
        again = [(o.key, o.payload) for o in self.out.values() if not o.released]
        self.out.clear()
        self.pending.extendleft(reversed(again))


class Subscriber(Client):
    """Subscribes once to `filter` at `qos` and acknowledges every delivery at once."""

    def __init__(self, *args: Any, qos: int, filter: str, **kw: Any):
        super().__init__(*args, **kw)
        self.qos, self.filter = qos, filter
        self.subscribed = False
        self._suback: asyncio.Future[codec.Packet] | None = None
        self._sub_pid = 0
        self.history.subs[self.cid] = SubInfo(self.version, qos, filter)

    async def on_connected(self, link: _Link) -> None:
        # a session not present (first connect or lost by the broker) has no subscription
        assert link.conn is not None
        if self.subscribed and link.conn.session_present:
            return
        self._suback = asyncio.get_running_loop().create_future()
        self._sub_pid = self.next_pid()
        link.write(codec.subscribe(self._sub_pid, [(self.filter, self.qos)], version=self.version))

    def _session_lost(self) -> None:
        super()._session_lost()
        self.subscribed = False

    def handle(self, link: _Link, pkt: codec.Packet) -> None:
        assert link.conn is not None
        if pkt.type == codec.PUBLISH:
            key = parse_payload(pkt.payload)
            if key is None or key[1] != pkt.topic:
                self.history.corrupt.append(
                    (self.cid, self.history.now(), f"payload {pkt.payload[:60]!r} on {pkt.topic!r}")
                )
            if pkt.qos == 2:
                if pkt.packet_id in self.awaiting_rel:
                    self.history.deduped(self.cid)  # a resend of one the application already has
                    link.write(codec.ack(codec.PUBREC, pkt.packet_id))
                    return
                self.awaiting_rel.add(pkt.packet_id)
            if key is not None:
                self.history.delivered(
                    Delivery(
                        self.history.now(),
                        self.cid,
                        *key,
                        pkt.qos,
                        pkt.dup,
                        pkt.packet_id,
                        link.node,
                        link.conn.idx,
                    )
                )
            if pkt.qos == 1:
                link.write(codec.ack(codec.PUBACK, pkt.packet_id))
            elif pkt.qos == 2:
                link.write(codec.ack(codec.PUBREC, pkt.packet_id))
        elif pkt.type == codec.PUBREL:
            self.awaiting_rel.discard(pkt.packet_id)
            link.write(codec.ack(codec.PUBCOMP, pkt.packet_id))
        elif pkt.type == codec.SUBACK:
            if pkt.packet_id != self._sub_pid:
                return self.unexpected(link, pkt)
            ok = bool(pkt.codes) and all(c < 0x80 for c in pkt.codes)
            self.history.subscribed(self.cid, ok)
            if ok:
                self.subscribed = True
            else:
                self.history.notes.append(f"{self.history.now():.3f} {self.cid}: SUBACK {pkt.codes}")
                link.close()  # try again on the next connection
        else:
            super().handle(link, pkt)
