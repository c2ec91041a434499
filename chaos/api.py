"""The management API under faults: a publisher over HTTP, and the keys every node's API checks.

`POST /api/v1/publish` answers 200 at QoS 1 only once the message is stored as a PUBACK needs it to be
(issue 29), so its 200 is an acknowledgement like any other and the checker holds it to the same rules:
never lost, never stuck. HTTP has no session: a request whose answer was lost (a node killed or paused
mid-request, Redis away) is sent again, to another live node, and may then be delivered twice, which
QoS 1 allows. Nor does it order requests answered by different nodes: each node routes what it is given
on its own path (to a subscriber on a third node, through its own connections), so a message taken by
one node can reach a subscriber after a later one taken by another, as with two MQTT publishers. The
publisher keeps to one node while it answers, as a client's kept-alive connection through a Service
does, sends the next message only after the last one's 200, and the checker holds its messages to publish
order among those one node acknowledged (docs/api.md says the same to users).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from chaos.history import History, MsgKey, payload_of

ATTEMPT_TIMEOUT = 5.0  # seconds for one request (a paused node answers nothing)

ApiPicker = Callable[[random.Random], tuple[str, str] | None]  # (node, base URL) of a live node's API


def admin_key(keys_file: Path) -> str:
    """A fresh admin key in `keys_file`, made as users make theirs: `fleetmq-broker apikey`."""
    out = subprocess.run(
        [sys.executable, "-m", "fleetmq.broker", "apikey", str(keys_file), "chaos", "--role", "admin"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip().splitlines()[-1]


class ApiPublisher:
    """QoS 1 messages over the management API at `rate` a second, round robin over its topics, one request
    at a time, each sent again until a node answers 200."""

    def __init__(
        self,
        cid: str,
        history: History,
        pick: ApiPicker,
        rng: random.Random,
        *,
        key: str,
        topics: list[str],
        rate: float,
    ):
        self.cid, self.history, self.pick, self.rng = cid, history, pick, rng
        self.topics, self.rate = topics, rate
        self.headers = {"Authorization": f"Bearer {key}"}
        self.seqs = dict.fromkeys(topics, 0)
        self.current: tuple[MsgKey, bytes] | None = None
        self.node: tuple[str, str] | None = None  # (name, URL) of the node it keeps to while it answers
        self.producing = True
        self.stopping = False
        self.attempts = 0
        self.answers: collections.Counter[str] = collections.Counter()  # "200", "503", "timeout"...
        self._made = 0

    def stop(self) -> None:
        self.stopping = True

    def idle(self) -> bool:
        return self.current is None

    def _make(self) -> tuple[MsgKey, bytes]:
        topic = self.topics[self._made % len(self.topics)]
        self._made += 1
        seq = self.seqs[topic]
        self.seqs[topic] = seq + 1
        key = (self.cid, topic, seq)
        return key, payload_of(*key, pad=16)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=ATTEMPT_TIMEOUT)
        async with aiohttp.ClientSession(timeout=timeout, headers=self.headers) as http:
            backoff = 0.1
            while not self.stopping:
                if self.current is None:
                    if not self.producing:
                        await asyncio.sleep(0.1)
                        continue
                    self.current = self._make()
                picked = self.node or self.pick(self.rng)
                if picked is None:
                    await asyncio.sleep(0.2)
                    continue
                if await self._post(http, *picked):
                    self.node = picked
                    backoff = 0.1
                    await asyncio.sleep(1.0 / self.rate)
                else:
                    self.node = None  # (another one next time: a node that failed may be gone)
                    await asyncio.sleep(backoff * (0.5 + self.rng.random()))
                    backoff = min(backoff * 2, 2.0)

    async def _post(self, http: aiohttp.ClientSession, node: str, url: str) -> bool:
        """One attempt at the current message; whether a node took it (200)."""
        assert self.current is not None
        key, payload = self.current
        body = {
            "topic": key[1],
            "payload": base64.b64encode(payload).decode(),
            "payload_encoding": "base64",
            "qos": 1,
        }
        self.attempts += 1
        self.history.sent(*key, 1, node, per_node=True)
        try:
            async with http.post(f"{url}/api/v1/publish", json=body) as r:
                await r.read()
                status = str(r.status)
        except TimeoutError:
            status = "timeout"
        except (aiohttp.ClientError, OSError):
            status = "connection error"
        self.answers[status] += 1
        if status != "200":
            return False
        self.history.acked(key, node)
        self.current = None
        return True

    def report(self) -> dict[str, Any]:
        return {"cid": self.cid, "requests": self.attempts, "answers": dict(self.answers)}

    def describe(self) -> str:
        return describe(self.report())


def describe(report: dict[str, Any]) -> str:
    """A publisher's report (ApiPublisher.report, kept in the run's JSON) for the summary."""
    answers = ", ".join(f"{what} {n:,}" for what, n in sorted(report["answers"].items()))
    return f"{report['cid']}: {report['requests']:,} requests ({answers})"
