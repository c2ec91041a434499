"""A crowd of persistent MQTT 5 clients in a process of its own, for e2e tests that need more clients than
paho's threaded loop can watch in one process (select() stops at descriptor 1024: e2e/load.py fd_room).

    python -m e2e.crowd HOST PORT N PREFIX

Each client connects with a session of its own (Clean Start 0, expiry 1 hour) and reconnects by itself
(1 to 4 s) when it is disconnected. The crowd prints `connected K` whenever K clients are connected, and on
SIGTERM prints `moved {"i": [reason codes of the disconnects it saw]}` (JSON) and exits, closing every
socket without DISCONNECT (so the broker sees the clients go).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def main(argv: list[str]) -> int:
    host, port, n, prefix = argv[0], int(argv[1]), int(argv[2]), argv[3]
    lock = threading.Lock()
    connected: set[int] = set()
    moved: dict[int, list[int]] = {i: [] for i in range(n)}
    done = threading.Event()
    clients: list[mqtt.Client] = []

    def make(i: int) -> mqtt.Client:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{prefix}-{i}", protocol=mqtt.MQTTv5)
        c.reconnect_delay_set(1, 4)

        def on_connect(_c, _u, _flags, rc, _p):
            if not rc.is_failure:
                with lock:
                    connected.add(i)
                    print(f"connected {len(connected)}", flush=True)

        def on_disconnect(_c, _u, _flags, rc, _p):
            with lock:
                connected.discard(i)
                if not done.is_set():
                    moved[i].append(rc.value)

        c.on_connect, c.on_disconnect = on_connect, on_disconnect
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        c.connect_async(host, port, keepalive=30, clean_start=False, properties=props)
        c.loop_start()
        return c

    def stop(*_: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    for i in range(n):
        clients.append(make(i))
        time.sleep(0.005)
    done.wait()
    with lock:
        print("moved " + json.dumps({str(i): r for i, r in moved.items()}), flush=True)
    os._exit(0)  # (every socket closed by the exit at once: stopping 230 loop threads one by one is slow)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
