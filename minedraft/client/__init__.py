"""Python SDK for the gateway's public gRPC API (minedraft.v1.Generation and DrafterPool).

Results come back as frozen dataclasses and failures as typed exceptions, so callers never
touch protobuf messages or grpc status objects. `types` holds the results, the sampling
options and the wire conversions, `errors` the exceptions, `base` what both clients share,
`sync` the blocking client, `aio` the asyncio one. TLS, mTLS and API keys are the clients'
keyword arguments (tls_ca, tls_client_cert, tls_client_key, api_key; docs/security.md); bad
ones raise SecurityError (a ValueError) when the client is made.
"""

from minedraft.client.aio import AsyncChunkStream, AsyncClient
from minedraft.client.errors import (InvalidRequest, MineDraftError, NotFound, RequestCancelled,
                                     RequestTimeout, ResourceExhausted, ServerUnavailable,
                                     Unauthenticated, error_from_rpc)
from minedraft.client.sync import ChunkStream, Client
from minedraft.client.types import (CLIENT_TIMEOUT, DEFAULT_TARGET, AcceptanceSummary, DrafterInfo,
                                    GenerationResult, Prompt, SamplingOptions, Speculation, StreamChunk,
                                    Timeout, build_request, drafters_from_proto, message_to_dict)
from minedraft.service.security import SecurityError

__all__ = [
    "CLIENT_TIMEOUT", "DEFAULT_TARGET", "AcceptanceSummary", "AsyncChunkStream", "AsyncClient",
    "ChunkStream", "Client", "DrafterInfo", "GenerationResult", "InvalidRequest",
    "MineDraftError", "NotFound", "Prompt", "RequestCancelled", "RequestTimeout",
    "ResourceExhausted", "SamplingOptions", "SecurityError", "ServerUnavailable", "Speculation", "StreamChunk",
    "Timeout", "Unauthenticated", "build_request", "drafters_from_proto", "error_from_rpc", "message_to_dict",
]
