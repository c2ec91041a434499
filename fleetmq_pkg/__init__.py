"""fleetmq: an MQTT broker fleet on Kubernetes."""
