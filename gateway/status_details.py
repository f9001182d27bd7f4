"""RequestErrors as gRPC statuses: the code and message clients have always had and, where a
field is at fault, a `google.rpc.BadRequest` naming it in the rich status details (what
grpcurl and `grpc_status.rpc_status.from_call` show)."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from gateway.frontend import RequestError


def to_status(err: RequestError) -> grpc.Status:
    """The status to end the call with; a BadRequest field violation when a field is at fault."""
    status = status_pb2.Status(code=err.code.value[0], message=err.message)
    if err.field is not None and status.code == code_pb2.INVALID_ARGUMENT:
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=err.field, description=err.message)]))
        status.details.append(detail)
    return rpc_status.to_status(status)


async def abort(context: grpc.aio.ServicerContext, err: RequestError) -> None:
    """End the call with `err` (raises, as context.abort does)."""
    await context.abort_with_status(to_status(err))
