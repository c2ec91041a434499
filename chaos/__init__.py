"""Fault injection for a fleetmq fleet (``python -m chaos``, ``make chaos``).

Written apart from the broker on purpose: its MQTT client, processes, Redis proxy, nemesis and checker
share no code with ``fleetmq.broker``, so a bug in the broker cannot hide itself in the checks. The
brokers are black boxes reached over real sockets.
"""
