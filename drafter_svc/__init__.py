"""Drafter service: the draft model behind gRPC (`python -m drafter_svc`)."""
