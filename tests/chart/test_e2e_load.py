"""e2e/load.py, the e2e's QoS 1 and 2 load with broker deletions, against real fleetmq processes sharing a real
redis-server: a deleted broker is stopped (SIGTERM, as the kubelet does) and started again, as its
StatefulSet would, so the e2e's client half is checked where no kind cluster can run."""

from __future__ import annotations

import threading

import pytest

from e2e.load import load_with_deletions

pytestmark = pytest.mark.redis


class Local:
    """A broker process as an e2e endpoint: reachable while it runs, started again on demand."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.host, self.local = broker.host, broker.port

    def alive(self) -> bool:
        return self.broker.alive()

    def start(self) -> None:
        raise OSError("not running yet")  # the restart thread brings it back


@pytest.mark.timeout(300)
@pytest.mark.parametrize("qos", [1, 2])
def test_no_acked_message_lost_when_brokers_are_deleted(fleet, qos):
    nodes = fleet(3)
    endpoints = {f"edge-{i}": Local(n) for i, n in enumerate(nodes)}
    restarts: list[threading.Thread] = []

    def delete(name: str) -> None:
        broker = endpoints[name].broker
        broker.terminate()
        restarts.append(threading.Thread(target=broker.restart))  # a new pod, same name and address
        restarts[-1].start()

    result = load_with_deletions(endpoints, delete, f"e2e/load/local{qos}", total=1500, qos=qos)
    for t in restarts:
        t.join(30)
    print(result)
    assert result.deleted == ["edge-1", "edge-0"]
    assert result.subscriber_reconnects >= 1 and result.publisher_reconnects >= 1
    assert len(result.acked) == result.total and not result.lost, result
