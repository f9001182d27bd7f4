"""Generated protobuf and gRPC stubs for protos/minedraft/v1 (regenerate: make protos)."""
