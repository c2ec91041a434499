"""The fleetmq Kubernetes operator (issue 5)."""
