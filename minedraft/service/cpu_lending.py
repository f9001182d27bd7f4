"""The drafter's cores lent to the verifier while nothing drafts (auto mode's plain decoding).

Lending moves every thread of the verifier onto its own cores plus the lent ones and raises
torch's thread count to match; the next step that drafts again hands them back.

Measured on a 2-core AMD EPYC VM (torch 2.13, OpenMP, 34 threads in the process): a switch
costs ~0.1 ms (median), nearly all of it one sched_setaffinity per thread; torch.set_num_threads
1 -> 2 -> 1 is under 1 us. Handing back right after a two-thread forward can cost up to ~5 ms
more: OpenMP's idle worker spin-waits on the own core it was moved to, taking it from the
compute thread until it sleeps. OMP_WAIT_POLICY=PASSIVE removes that (~0.04 ms a switch), at a
price on every parallel region of every forward, so it is the deployment's choice.
"""

from __future__ import annotations

import logging

import torch

from minedraft.service.placement import pin_all_threads

logger = logging.getLogger("minedraft.service")


class CoreLender:
    """Switches the process between its own cores and its own plus the lent ones.

    Only the compute thread may call `use`: torch's intra-op thread count (OpenMP's) belongs
    to the thread that sets it, so it must be the one that runs the forwards.
    """

    def __init__(self, own_cpus: set[int], threads: int, lent_cpus: set[int]) -> None:
        """threads: the configured torch threads on the own cores (0: torch's current count)."""
        if not own_cpus or not lent_cpus or own_cpus & lent_cpus:
            raise ValueError(f"lent cores {sorted(lent_cpus)} must be non-empty and disjoint from "
                             f"the own cores {sorted(own_cpus)}")
        self.own_cpus = frozenset(own_cpus)
        self.all_cpus = frozenset(own_cpus | lent_cpus)
        self.own_threads = threads or torch.get_num_threads()
        # One thread per core in use; never fewer than configured for the own cores alone.
        self.borrow_threads = max(self.own_threads, len(self.all_cpus))
        self.borrowing = False

    def use(self, borrow: bool) -> bool:
        """Compute on the lent cores too (borrow) or only on the own ones; a no-op when
        already so. -> whether the lent cores are in use now."""
        if borrow == self.borrowing:
            return borrow
        if borrow:
            # The wider mask first: OpenMP workers started by the new count inherit it.
            pin_all_threads(self.all_cpus)
            torch.set_num_threads(self.borrow_threads)
        else:
            torch.set_num_threads(self.own_threads)
            pin_all_threads(self.own_cpus)
        self.borrowing = borrow
        logger.debug("computing on cores %s with %d threads", sorted(self.all_cpus if borrow else self.own_cpus),
                     torch.get_num_threads())
        return borrow
