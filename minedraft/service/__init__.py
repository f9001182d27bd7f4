"""Plumbing shared by the services, one job per module: `flags` (the runner's command-line
flags), `placement` (devices and CPU cores), `network` (ports and the host peers dial),
`server` (the gRPC server with its health service, and waiting for a peer's), `runtime`
(logging and the uvloop main loop with its signals), `security` (TLS, API keys and the
internal token: configuration and flags) and `auth` (the interceptors that enforce them)."""
