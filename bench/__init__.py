"""Side-by-side benchmark of the fleetmq broker against mosquitto (``python -m bench``)."""
