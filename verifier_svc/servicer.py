"""gRPC handlers of the verifier (tensor-parallel rank 0): transport only.

All model work runs on one compute thread so the event loop never blocks; steps are
serialised there in arrival order, and a step that names a predecessor (after_step_id)
queues behind it. Each step is handed to `StepExecutor.lead`, which takes its drafts off the
data plane (one pairing per drafter, matched by the drafter's step id) and shares the step
with the other tensor-parallel ranks.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc

from minedraft.data_plane import DraftPairings, decode_payload
from minedraft.engine_requests import UnknownRequest
from minedraft.kv_cache import OutOfBlocks
from minedraft.protocol import engine_info
from minedraft.service.placement import compute_thread
from minedraft.v1 import engine_pb2, engine_pb2_grpc
from verifier_svc.steps import StepExecutor

_STEPS_REMEMBERED = 1024
PREDECESSOR_WAIT_S = 60.0   # a step naming a predecessor that never comes is refused after this


class VerifierServicer(engine_pb2_grpc.VerifierServicer):
    def __init__(self, executor: StepExecutor, pairings: DraftPairings, model_name: str,
                 compute: ThreadPoolExecutor | None = None) -> None:
        """compute: the thread the executor's model was loaded on (`compute_thread`); a new
        one if None."""
        self.executor = executor
        self.pairings = pairings
        self.model_name = model_name
        self.compute = compute or compute_thread("verify")
        self.instance_id = uuid.uuid4().hex
        self._steps_queued: dict[int, asyncio.Event] = {}

    async def Step(self, request: engine_pb2.VerifyStepRequest, context) -> engine_pb2.VerifyStepResponse:
        loop = asyncio.get_running_loop()
        try:
            if request.after_step_id:
                try:
                    await asyncio.wait_for(self._queued(request.after_step_id).wait(), PREDECESSOR_WAIT_S)
                except asyncio.TimeoutError:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                        f"after_step_id: step {request.after_step_id} did not arrive "
                                        f"within {PREDECESSOR_WAIT_S:.0f} s")
                self._steps_queued.pop(request.after_step_id, None)
            # The compute thread runs its queue in order: once queued, a step's successor may
            # queue behind it at once, so the thread goes from one straight to the next.
            lead = functools.partial(self.executor.lead, request, self.pairings)
            remaining = context.time_remaining() if context is not None else None
            if remaining is not None:
                # Drafts that do not come within half the caller's deadline are lost (k = 0)
                # rather than failing the whole step: one stalled drafter costs one step's
                # speculation, not the batch.
                lead = functools.partial(lead, recv_deadline=time.monotonic() + remaining / 2)
            result = loop.run_in_executor(self.compute, lead)
            self._queued(request.step_id).set()
            return await result
        except UnknownRequest as err:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"verify step {request.step_id}: {err}")
        except (ValueError, KeyError) as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"verify step {request.step_id}: {err}")
        except OutOfBlocks as err:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(err))
        finally:
            self._queued(request.step_id).set()      # also when it failed: its successor may go

    async def AbandonDrafts(self, request: engine_pb2.AbandonDraftsRequest,
                            context) -> engine_pb2.AbandonDraftsResponse:
        if not request.drafter_id or not request.draft_step_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "drafter_id and draft_step_id: both are required")
        if not self.pairings.can_abandon:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this verifier's data plane is {self.pairings.backend!r}: a step's drafts "
                                f"cannot be abandoned")
        self.pairings.abandon(request.drafter_id, request.draft_step_id)
        return engine_pb2.AbandonDraftsResponse()

    def _queued(self, step_id: int) -> asyncio.Event:
        """Set once step `step_id` is in the compute queue. Only the latest steps are
        remembered: a step names the one just before it, so older ones are never waited for."""
        event = self._steps_queued.get(step_id)
        if event is None:
            event = self._steps_queued[step_id] = asyncio.Event()
            while len(self._steps_queued) > _STEPS_REMEMBERED:
                self._steps_queued.pop(next(iter(self._steps_queued)))
        return event

    async def ConnectDrafter(self, request: engine_pb2.ConnectDrafterRequest,
                             context) -> engine_pb2.ConnectDrafterResponse:
        try:
            address, key = self.pairings.connect(request.drafter_id, request.pairing_key)
        except PermissionError as err:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(err))
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        except OSError as err:                  # no port or socket to rendezvous on
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"data plane {self.pairings.backend}: {err}")
        return engine_pb2.ConnectDrafterResponse(data_plane=self.pairings.backend, address=address,
                                                 pairing_key=key)

    async def DisconnectDrafter(self, request: engine_pb2.DisconnectDrafterRequest,
                                context) -> engine_pb2.DisconnectDrafterResponse:
        try:
            self.pairings.check_key(request.drafter_id, request.pairing_key)
        except PermissionError as err:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(err))
        await asyncio.get_running_loop().run_in_executor(None, self.pairings.disconnect, request.drafter_id)
        return engine_pb2.DisconnectDrafterResponse()

    async def PutDrafts(self, request: engine_pb2.DraftPayload, context) -> engine_pb2.PutDraftsResponse:
        if self.pairings.backend != "inband":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this verifier's data plane is {self.pairings.backend!r}, not 'inband'")
        try:
            self.pairings.deliver(request.drafter_id, decode_payload(
                step_id=request.step_id, draft_token_ids=request.draft_token_ids,
                num_tokens=request.num_tokens))
        except KeyError as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err.args[0]))
        except ValueError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return engine_pb2.PutDraftsResponse()

    async def GetInfo(self, request, context) -> engine_pb2.EngineInfo:
        verifier = self.executor.verifier
        info = engine_info(verifier, self.model_name, self.pairings.backend, self.instance_id,
                           synthetic_acceptance=verifier.synthetic_acceptance)
        info.tp_size = self.executor.tp.size
        return info
