"""Python SDK for the gateway's public gRPC API (minedraft.v1.Generation and DrafterPool).

Results come back as frozen dataclasses and failures as typed exceptions, so callers never
touch protobuf messages or grpc status objects. `types` holds the results, the sampling
options and the wire conversions, `errors` the exceptions, `base` what both clients share,
`sync` the blocking client, `aio` the asyncio one.
"""

from minedraft.client.aio import AsyncChunkStream, AsyncClient
from minedraft.client.errors import (InvalidRequest, MineDraftError, NotFound, RequestCancelled,
                                     RequestTimeout, ResourceExhausted, ServerUnavailable,
                                     error_from_rpc)
from minedraft.client.sync import ChunkStream, Client
from minedraft.client.types import (CLIENT_TIMEOUT, DEFAULT_TARGET, AcceptanceSummary, DrafterInfo,
                                    GenerationResult, Prompt, SamplingOptions, StreamChunk, Timeout,
                                    build_request, drafters_from_proto, message_to_dict)

__all__ = [
    "CLIENT_TIMEOUT", "DEFAULT_TARGET", "AcceptanceSummary", "AsyncChunkStream", "AsyncClient",
    "ChunkStream", "Client", "DrafterInfo", "GenerationResult", "InvalidRequest",
    "MineDraftError", "NotFound", "Prompt", "RequestCancelled", "RequestTimeout",
    "ResourceExhausted", "SamplingOptions", "ServerUnavailable", "StreamChunk", "Timeout",
    "build_request", "drafters_from_proto", "error_from_rpc", "message_to_dict",
]
