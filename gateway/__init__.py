"""Gateway service: public gRPC API, admission queue, two-batch scheduler. Built in the services issue."""
