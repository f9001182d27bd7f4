"""Gateway service: public gRPC API, admission queue and the two-batch Batch Manager (`python -m gateway`)."""
