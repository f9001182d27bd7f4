"""Steps over the data plane between two processes, checked bit for bit.

NCCL when two GPUs are visible (one rank per GPU), gloo otherwise. Prints the transfer
time of a step whose draft tokens ride in the header and of one too large for it (only
token ids travel: coupled verification needs no draft probabilities).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time

import torch

from minedraft.data_plane import DistributedDraftReceiver, DistributedDraftSender, DraftPayload
from minedraft.data_plane.payload import INLINE_TOKENS
from minedraft.service.network import free_port

STEPS = [(7, 64), (8, 4 * INLINE_TOKENS)]   # (step_id, num_tokens): in the header, then a message of its own


def _payload(step_id: int, num_tokens: int, vocab: int) -> DraftPayload:
    gen = torch.Generator().manual_seed(step_id)
    return DraftPayload(step_id, torch.randint(0, vocab, (num_tokens,), generator=gen))


def _drafter(port: int, backend: str, device: str, vocab: int) -> None:
    sender = DistributedDraftSender("127.0.0.1", port, backend=backend, device=device)
    for step_id, num_tokens in STEPS:
        sender.send(_payload(step_id, num_tokens, vocab))
    sender.close()


def main(vocab: int = 151936) -> int:
    two_gpus = torch.cuda.is_available() and torch.cuda.device_count() > 1
    backend, devices = ("nccl", ("cuda:0", "cuda:1")) if two_gpus else ("gloo", ("cpu", "cpu"))
    port = free_port()
    proc = mp.get_context("spawn").Process(target=_drafter, args=(port, backend, devices[1], vocab))
    proc.start()
    receiver = DistributedDraftReceiver("127.0.0.1", port, backend=backend, device=devices[0])
    all_exact = True
    for step_id, num_tokens in STEPS:
        start = time.perf_counter()
        got = receiver.recv(step_id, num_tokens)
        elapsed = time.perf_counter() - start
        exact = torch.equal(got.token_ids.cpu(), _payload(step_id, num_tokens, vocab).token_ids)
        all_exact = all_exact and exact
        print(f"{backend} data plane: step {step_id}, {num_tokens} drafts, {got.nbytes} B in "
              f"{elapsed * 1e3:.1f} ms, bit-exact={exact}")
    proc.join(60)
    return 0 if all_exact and proc.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
