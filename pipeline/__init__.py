"""The fleetmq PySpark pipeline over the brokers' event log (issue 7)."""
