"""Verifier service: the target model behind gRPC (`python -m verifier_svc`)."""
