"""The sans-I/O WebSocket layer: fed bytes (even one at a time), it returns MQTT bytes and replies."""

from __future__ import annotations

from fleetmq.broker.websocket import WebSocket
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Message, RejectConnection, Request


def client_and_server(path: str = "/mqtt", offer=("mqtt",)):
    client = WSConnection(ConnectionType.CLIENT)
    server = WebSocket("/mqtt")
    mqtt, out = server.receive(client.send(Request(host="h", target=path, subprotocols=list(offer))))
    assert mqtt == b""
    client.receive_data(out)
    return client, server, list(client.events())


def test_accepts_mqtt_and_carries_the_byte_stream_one_byte_at_a_time():
    client, server, events = client_and_server()
    assert [type(e) for e in events] == [AcceptConnection] and events[0].subprotocol == "mqtt"
    wire = client.send(Message(data=b"\x10\x0cMQTT")) + client.send(Message(data=b"\x04rest"))
    got = b"".join(server.receive(wire[i : i + 1])[0] for i in range(len(wire)))
    assert got == b"\x10\x0cMQTT\x04rest" and not server.closed
    client.receive_data(server.frame(b"\x20\x02\x00\x00"))
    assert [bytes(e.data) for e in client.events() if isinstance(e, BytesMessage)] == [b"\x20\x02\x00\x00"]


def test_refuses_other_paths_and_subprotocols():
    for path, offer, status in (("/x", ("mqtt",), 404), ("/mqtt", (), 400), ("/mqtt", ("v12.stomp",), 400)):
        _, server, events = client_and_server(path, offer)
        assert [e.status_code for e in events if isinstance(e, RejectConnection)] == [status]
        assert server.closed and server.error


def test_close_handshake_and_eof():
    client, server, _ = client_and_server()
    _, out = server.receive(client.send(CloseConnection(code=1000)))
    client.receive_data(out)
    assert [e.code for e in client.events() if isinstance(e, CloseConnection)] == [1000] and server.closed
    assert server.frame(b"late") == b""  # nothing is framed after the close
    _, server, _ = client_and_server()
    assert server.receive(None) == (b"", b"") and server.closed
