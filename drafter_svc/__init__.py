"""Drafter service: wraps `minedraft.drafter.Drafter` behind gRPC. Built in the services issue."""
