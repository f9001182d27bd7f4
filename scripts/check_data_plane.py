"""One step over the data plane between two processes, checked bit for bit.

NCCL when two GPUs are visible (one rank per GPU), gloo otherwise. Prints the transfer
time of a full-vocabulary payload (64 drafts with bfloat16 probability rows).
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time

import torch

from minedraft.data_plane import DistributedDraftReceiver, DistributedDraftSender, DraftPayload
from minedraft.service.network import free_port

STEP, NUM_TOKENS = 7, 64


def _payload(vocab: int) -> DraftPayload:
    gen = torch.Generator().manual_seed(0)
    return DraftPayload(STEP, torch.randint(0, vocab, (NUM_TOKENS,), generator=gen),
                        torch.rand(NUM_TOKENS, vocab, generator=gen).to(torch.bfloat16))


def _drafter(port: int, backend: str, device: str, vocab: int) -> None:
    sender = DistributedDraftSender("127.0.0.1", port, backend=backend, device=device)
    sender.send(_payload(vocab))
    sender.close()


def main(vocab: int = 151936) -> int:
    two_gpus = torch.cuda.is_available() and torch.cuda.device_count() > 1
    backend, devices = ("nccl", ("cuda:0", "cuda:1")) if two_gpus else ("gloo", ("cpu", "cpu"))
    port = free_port()
    proc = mp.get_context("spawn").Process(target=_drafter, args=(port, backend, devices[1], vocab))
    proc.start()
    receiver = DistributedDraftReceiver("127.0.0.1", port, backend=backend, device=devices[0])
    start = time.perf_counter()
    got = receiver.recv(STEP, NUM_TOKENS, True, vocab, torch.bfloat16)
    elapsed = time.perf_counter() - start
    want = _payload(vocab)
    exact = torch.equal(got.token_ids.cpu(), want.token_ids) and torch.equal(got.probs.cpu(), want.probs)
    proc.join(60)
    print(f"{backend} data plane: step {STEP}, {got.nbytes / 1e6:.1f} MB in {elapsed * 1e3:.1f} ms, "
          f"bit-exact={exact}")
    return 0 if exact and proc.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
