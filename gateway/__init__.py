"""Gateway service: public gRPC API, admission queue and the two-batch scheduler (`python -m gateway`)."""
