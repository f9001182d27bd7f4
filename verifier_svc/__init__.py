"""Verifier service: wraps `minedraft.verifier.Verifier` behind gRPC. Built in the services issue."""
