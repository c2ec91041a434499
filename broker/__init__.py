"""The fleetmq MQTT broker node."""
