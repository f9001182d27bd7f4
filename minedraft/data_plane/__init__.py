"""The data plane: moves one drafter step's draft token ids to the verifier.

Only token ids travel: verification of sampled requests is coupled through shared noise
(`minedraft.rejection_sampler`), so draft probabilities are never needed. Control messages
(small, over gRPC) tell the verifier how many drafts a step carries, and it checks what
arrives against them. Two transports share one interface (`payload.py`):

- `distributed.py`: torch.distributed point-to-point on a two-rank process group built from
  its own `TCPStore`, never the global default group, so one verifier process can pair with
  several drafters (one rendezvous port each). Gloo on CPU, NCCL on GPU. The verifier is rank
  0 and hosts the store; the drafter is rank 1. A small header announces each payload, so the
  verifier can receive it before its control message arrives.
- `local.py`: a Unix domain socket per pairing, drafter and verifier on one host: no
  polling loop (gloo's wakes both ends every 10 ms, on the cores the models run on), one
  wake-up per step's drafts. The drafter presents its pairing key before anything is read.
- `pairings.py`: the verifier's side of a drafter pool: one pairing (of either transport)
  per drafter, formed when the drafter joins, dropped when it dies.
- `inband.py`: the fallback when no process group can be formed; payloads ride a gRPC call
  (`PutDrafts`) that the services make, the token ids as safetensors bytes. No gRPC or
  protobuf here: `encode_payload` / `decode_payload` convert to and from the message's fields.
"""

from minedraft.data_plane.distributed import (DistributedDraftReceiver, DistributedDraftSender, connect_pair,
                                             listen_store)
from minedraft.data_plane.inband import InBandDraftReceiver, InBandDraftSender, decode_payload, encode_payload
from minedraft.data_plane.local import LocalDraftReceiver, LocalDraftSender
from minedraft.data_plane.payload import (DRAFTER_RANK, HEADER_TAG, VERIFIER_RANK, DraftPayload, DraftReceiver,
                                          DraftSender, empty_payload, step_tag)
from minedraft.data_plane.pairings import DraftPairings

__all__ = ["DRAFTER_RANK", "HEADER_TAG", "VERIFIER_RANK", "DistributedDraftReceiver", "DistributedDraftSender",
           "DraftPairings", "DraftPayload", "DraftReceiver", "DraftSender", "InBandDraftReceiver", "InBandDraftSender",
           "LocalDraftReceiver", "LocalDraftSender", "connect_pair", "decode_payload", "empty_payload",
           "encode_payload", "listen_store", "step_tag"]
