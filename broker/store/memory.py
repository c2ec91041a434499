"""The session store of a node alone: sessions in this process's memory."""

from __future__ import annotations

from collections.abc import Collection

from ..message import Message
from ..session import Session
from ..zones import ZoneSettings
from .base import Claimed, CommitResult, Discard, Enqueue, Op, Save, SessionStore


class MemoryStore(SessionStore):
    """Sessions in this process's memory: the default of `make run`, lost when the process ends."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._epochs: dict[str, int] = {}
        self._connections: dict[tuple[str, str], dict[str, str]] = {}  # (zone, user) -> client id -> instance

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        self._sessions.clear()

    async def claim(
        self,
        client_id: str,
        zone: ZoneSettings,
        zone_name: str,
        clean_start: bool,
        will: Message | None = None,
        will_delay: float = 0.0,
        expiry: float = 0.0,
        username: str | None = None,
        token: str = "",
    ) -> Claimed:
        epoch = self._epochs[client_id] = self._epochs.get(client_id, 0) + 1
        session = self._sessions.pop(client_id, None)
        if session is not None and clean_start:
            return Claimed(epoch, discarded=True)
        if session is not None:
            session.epoch = epoch
        return Claimed(epoch, session)

    async def take_connection(
        self,
        zone: str,
        username: str,
        client_id: str,
        instance: str,
        limit: int,
        live: Collection[str],
        dead: Collection[str] = (),
        last: bool = False,
    ) -> bool | list[str]:
        # (one node: every entry is this process's)
        held = self._connections.setdefault((zone, username), {})
        if sum(1 for cid in held if cid != client_id) >= limit:
            return False
        held[client_id] = instance
        return True

    async def free_connection(self, zone: str, username: str, client_id: str, instance: str) -> None:
        held = self._connections.get((zone, username))
        if held is not None and held.get(client_id) == instance:
            del held[client_id]
            if not held:
                del self._connections[zone, username]

    async def commit(self, ops: list[Op]) -> CommitResult:
        result = CommitResult([], [])
        sessions = self._sessions
        for op in ops:
            if isinstance(op, Save):
                sessions[op.session.client_id] = op.session
            elif isinstance(op, Enqueue):
                s = sessions.get(op.client_id)
                if s is None:
                    result.missing.append(op)
                    continue
                dropped = s.enqueue(op.delivery)
                if dropped:
                    result.dropped.append((s.zone_name, op.client_id, len(dropped)))
            elif isinstance(op, Discard):
                sessions.pop(op.client_id, None)
                self._epochs.pop(op.client_id, None)
        return result

    def offline_sessions(self) -> list[Session]:
        return list(self._sessions.values())
