"""MQTT round trips through a listener for the e2e: a subscriber and a publisher (each its own connection,
so through a Service they may reach different broker pods), one QoS 1 message. Used from this machine and,
unchanged, from a pod (this file and paho mounted there from a ConfigMap; only paho and the standard library
are imported):

    python clients.py '[{"name": "tcp-v5", "host": "edge-external-mqtt.mqtt", "port": 1883, "version": 5}]'
"""

from __future__ import annotations

import json
import ssl
import sys
import threading
import time
import uuid

import paho.mqtt.client as mqtt


def roundtrip(
    host: str,
    port: int,
    *,
    transport: str = "tcp",
    version: int = 5,
    ca: str | None = None,
    verify_name: bool = True,
    timeout: float = 20.0,
    username: str | None = None,
    password: str | None = None,
    cert: tuple[str, str] | None = None,
) -> dict:
    """Subscribe, publish one QoS 1 message, receive it (both clients with `username` and `password`, or
    the client certificate `cert` (certificate file, key file), if given). {"ok", "error", "seconds"}."""
    t0 = time.monotonic()
    topic = f"e2e/rt/{uuid.uuid4().hex[:10]}"
    payload = uuid.uuid4().hex.encode()
    got, subscribed = threading.Event(), threading.Event()
    box: dict = {}
    made: list[mqtt.Client] = []

    def make(role: str) -> mqtt.Client:
        c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"e2e-{role}-{uuid.uuid4().hex[:8]}",
            protocol=mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311,
            transport=transport,
        )
        if transport == "websockets":
            c.ws_set_options(path="/mqtt")
        if username is not None:
            c.username_pw_set(username, password)
        if ca:
            ctx = ssl.create_default_context(cafile=ca)
            ctx.check_hostname = verify_name  # the chain is checked either way
            if cert is not None:
                ctx.load_cert_chain(*cert)
            c.tls_set_context(ctx)
        made.append(c)
        return c

    def on_message(_c, _u, msg) -> None:
        box["payload"] = msg.payload
        got.set()

    try:
        sub = make("sub")
        sub.on_message = on_message
        sub.on_subscribe = lambda *_: subscribed.set()
        sub.connect(host, port, keepalive=15)
        sub.loop_start()
        sub.subscribe(topic, qos=1)
        if not subscribed.wait(timeout):
            return {"ok": False, "error": "no SUBACK", "seconds": time.monotonic() - t0}
        pub = make("pub")
        pub.connect(host, port, keepalive=15)
        pub.loop_start()
        info = pub.publish(topic, payload, qos=1)
        info.wait_for_publish(timeout)
        ok = got.wait(timeout) and box.get("payload") == payload
        return {
            "ok": ok,
            "error": "" if ok else f"received {box.get('payload')!r}",
            "seconds": time.monotonic() - t0,
        }
    except Exception as e:  # reported, not raised: the caller wants every transport's outcome
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "seconds": time.monotonic() - t0}
    finally:
        for c in made:
            c.disconnect()
            c.loop_stop()


def main(argv: list[str]) -> int:
    results = {}
    for case in json.loads(argv[1]):
        name = case.pop("name")
        results[name] = roundtrip(case.pop("host"), case.pop("port"), **case)
    print(json.dumps(results))
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
