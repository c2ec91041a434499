"""MqttBridge: a bridge from a fleet to a remote MQTT broker, derived from the broker's BridgeConfig."""

from __future__ import annotations

from fleetmq.broker.bridges import (
    BridgeConfig,
    BridgeQueue,
    BridgeRemote,
    BridgeTls,
    Forward,
    LoopPrevention,
    Reconnect,
)
from fleetmq.broker.bridges import Subscription as BridgeSubscription
from pydantic import ConfigDict, Field

from .base import Condition, CrdModel, ObjectRef, SecretKeyRef, SecretRef, doc
from .derive import derive_all

ForwardSpec = derive_all("ForwardSpec", Forward, doc(Forward))
BridgeSubscriptionSpec = derive_all("BridgeSubscriptionSpec", BridgeSubscription, doc(BridgeSubscription))
BridgeQueueSpec = derive_all("BridgeQueueSpec", BridgeQueue, doc(BridgeQueue))
ReconnectSpec = derive_all("ReconnectSpec", Reconnect, doc(Reconnect))
LoopPreventionSpec = derive_all("LoopPreventionSpec", LoopPrevention, "Loop prevention across bridges.")
_BridgeTlsBase = derive_all(
    "BridgeTlsBase", BridgeTls, doc(BridgeTls), skip=("cafile", "certfile", "keyfile")
)


class BridgeTlsSpec(_BridgeTlsBase):  # type: ignore[misc,valid-type]
    """TLS towards the remote (tls and wss transports)."""

    secretRef: SecretRef | None = Field(
        None,
        description="Secret with ca.crt (the CA to verify the remote against; default: the system's) and, for "
        "remotes that require a client certificate, tls.crt and tls.key.",
    )


_RemoteBase = derive_all(
    "BridgeRemoteBase", BridgeRemote, doc(BridgeRemote), {BridgeTls: BridgeTlsSpec}, skip=("password_file",)
)


class BridgeRemoteSpec(_RemoteBase):  # type: ignore[misc,valid-type]
    """The remote broker and the bridge's session there (always resumed: Clean Start 0)."""

    passwordSecretRef: SecretKeyRef | None = Field(
        None, description="Secret key holding the password at the remote (mounted into the broker pods)."
    )


_BridgeBase = derive_all(
    "MqttBridgeBase",
    BridgeConfig,
    doc(BridgeConfig),
    {
        BridgeRemote: BridgeRemoteSpec,
        Forward: ForwardSpec,
        BridgeSubscription: BridgeSubscriptionSpec,
        BridgeQueue: BridgeQueueSpec,
        Reconnect: ReconnectSpec,
        LoopPrevention: LoopPreventionSpec,
    },
    skip=("name",),
)


class MqttBridgeSpec(_BridgeBase):  # type: ignore[misc,valid-type]
    """A bridge from a fleet to one remote MQTT broker: forwards (egress), subscriptions (ingress)."""

    fleetRef: ObjectRef = Field(description="The BrokerFleet (same namespace) whose brokers run this bridge.")

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "(has(self.forwards) && size(self.forwards) > 0) || "
                    "(has(self.subscriptions) && size(self.subscriptions) > 0)",
                    "message": "a bridge needs at least one forward or subscription",
                }
            ]
        },
    )

    def bridge_config(
        self, name: str, password_file: str | None = None, tls_files: dict[str, str] | None = None
    ) -> BridgeConfig:
        """The broker's `bridges:` entry (snake_case, validated by the broker's model): the Secrets'
        files where the operator puts them (`tls_files`: cafile, certfile, keyfile, those there are)."""
        data = self.model_dump(exclude={"fleetRef"}, exclude_none=True)
        remote = data["remote"]
        remote.pop("passwordSecretRef", None)
        remote["password_file"] = password_file
        tls = remote.get("tls")
        if tls is not None:
            tls.pop("secretRef", None)
            tls |= tls_files or {}
        return BridgeConfig.model_validate({"name": name, **data})


class MqttBridgeStatus(CrdModel):
    """Observed state of the bridge, from the broker pods' reports."""

    observedGeneration: int | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    leader: str | None = Field(None, description="The broker pod forwarding the bridge.")
    connected: bool = Field(False, description="Whether the leader's connection to the remote is up.")
    queueMessages: int = Field(0, description="Messages waiting for the remote (the leader's count).")
    forwarded: int = Field(
        0, description="Messages the remote acknowledged, over all pods since they started."
    )
    dropped: dict[str, int] = Field(default_factory=dict, description="Messages not passed on, by reason.")
    lastError: str | None = Field(None, description="Why the last connection to the remote ended or failed.")
