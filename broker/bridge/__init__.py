"""Bridges to remote brokers at run time: the lease that picks the node leading each bridge and its
forwarding (runtime), the MQTT link between the bridge's local session and the remote (link, loop), and
the reconnect backoff. Their settings are `fleetmq.broker.bridges`, with the config they are part of."""
