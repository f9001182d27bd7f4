"""Admission: the queue of waiting requests and the KV ledger, owned in one place.

A request is admitted only when the KV blocks it can ever need (prompt + max_tokens + one
step of drafts) fit in what is not yet reserved, on the verifier and on the drafter it is
placed on, so no step ever runs out of cache. This ledger is the only writer of each
drafter's reservation figures (`DrafterHandle.reserved_blocks`, `request_ids`); the pool
only reports them.
"""

from __future__ import annotations

from collections import deque

from gateway.metrics import METRICS
from gateway.pool import DrafterHandle, DrafterPool
from gateway.request import ActiveRequest


class Admission:
    def __init__(self, kv_blocks: int, block_size: int, k: int, pool: DrafterPool | None) -> None:
        self.kv_blocks = kv_blocks          # the verifier's cache
        self.block_size = block_size        # the verifier's and every drafter's (the pool checks)
        self.k = k
        self.pool = pool
        self.waiting: deque[ActiveRequest] = deque()
        self._reserved: dict[str, int] = {}   # request id -> blocks reserved on the verifier

    def blocks_for(self, req: ActiveRequest) -> int:
        """KV blocks a request can ever need: admission reserves them, so no step runs out."""
        tokens = len(req.seq.prompt_token_ids) + req.seq.params.max_tokens + self.k + 1
        return -(-tokens // self.block_size)

    def fits_ever(self, req: ActiveRequest) -> bool:
        """Whether the request could be admitted into an empty verifier cache."""
        return self.blocks_for(req) <= self.kv_blocks

    def admit_next(self, place_on_drafter: bool) -> ActiveRequest | None:
        """The oldest waiting request if its KV fits now (and, with place_on_drafter, a
        drafter has room for it: it is placed there); None leaves it waiting, in order."""
        if not self.waiting:
            return None
        req = self.waiting[0]
        need = self.blocks_for(req)
        if sum(self._reserved.values()) + need > self.kv_blocks:
            return None
        if place_on_drafter:
            drafter = self.choose_drafter(need)
            if drafter is not None:
                self.assign(req, drafter)
            elif self._fits_some_drafter(need):     # every drafter is full: wait for one to drain
                return None
            # else no drafter could ever hold it: it runs at k = 0 rather than block the queue
        self.waiting.popleft()
        self._reserved[req.request_id] = need
        METRICS.request_admitted(req)
        return req

    @property
    def reserved_blocks(self) -> int:
        """The verifier's KV blocks reserved now (the metrics' KV usage)."""
        return sum(self._reserved.values())

    def choose_drafter(self, need_blocks: int) -> DrafterHandle | None:
        """The least-loaded drafter of the pool with room for `need_blocks` more KV blocks."""
        if self.pool is None:
            return None
        fits = [h for h in self.pool.drafters.values() if h.reserved_blocks + need_blocks <= h.num_blocks]
        if not fits:
            return None
        return min(fits, key=lambda h: (len(h.request_ids), h.reserved_blocks))

    def _fits_some_drafter(self, need_blocks: int) -> bool:
        return self.pool is not None and any(need_blocks <= h.num_blocks for h in self.pool.drafters.values())

    def place(self, req: ActiveRequest) -> None:
        """Give a request without a drafter one, if any has room (it drafts from its next step)."""
        drafter = self.choose_drafter(self.blocks_for(req))
        if drafter is not None:
            self.assign(req, drafter)

    def assign(self, req: ActiveRequest, drafter: DrafterHandle) -> None:
        req.drafter, req.known_to_drafter, req.pending_diff = drafter, False, []
        drafter.request_ids.add(req.request_id)
        drafter.reserved_blocks += self.blocks_for(req)
        drafter.requests_assigned += 1

    def unassign(self, req: ActiveRequest) -> None:
        """Take a request off its drafter; its draft KV there is freed with the next call."""
        drafter = req.drafter
        if drafter is None:
            return
        drafter.request_ids.discard(req.request_id)
        drafter.reserved_blocks -= self.blocks_for(req)
        if req.known_to_drafter:
            drafter.pending_frees.append(req.request_id)
        req.drafter, req.known_to_drafter, req.pending_diff = None, False, []

    def release(self, req: ActiveRequest) -> None:
        """The request is over: its reservations go back (it may have been waiting still)."""
        if req in self.waiting:
            self.waiting.remove(req)
        self.unassign(req)
        self._reserved.pop(req.request_id, None)
