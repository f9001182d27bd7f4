from minedraft.v1 import generation_pb2 as _generation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NewRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "sampling", "seed")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _generation_pb2.SamplingOptions
    seed: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_generation_pb2.SamplingOptions, _Mapping]] = ..., seed: _Optional[int] = ...) -> None: ...

class TokenDiff(_message.Message):
    __slots__ = ("request_id", "new_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    new_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., new_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DraftItem(_message.Message):
    __slots__ = ("request_id", "num_draft")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_draft: int
    def __init__(self, request_id: _Optional[str] = ..., num_draft: _Optional[int] = ...) -> None: ...

class DraftStepRequest(_message.Message):
    __slots__ = ("step_id", "new_requests", "updates", "finished", "items", "reset", "dismiss", "catch_up")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    DISMISS_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    new_requests: _containers.RepeatedCompositeFieldContainer[NewRequest]
    updates: _containers.RepeatedCompositeFieldContainer[TokenDiff]
    finished: _containers.RepeatedScalarFieldContainer[str]
    items: _containers.RepeatedCompositeFieldContainer[DraftItem]
    reset: bool
    dismiss: bool
    catch_up: bool
    def __init__(self, step_id: _Optional[int] = ..., new_requests: _Optional[_Iterable[_Union[NewRequest, _Mapping]]] = ..., updates: _Optional[_Iterable[_Union[TokenDiff, _Mapping]]] = ..., finished: _Optional[_Iterable[str]] = ..., items: _Optional[_Iterable[_Union[DraftItem, _Mapping]]] = ..., reset: _Optional[bool] = ..., dismiss: _Optional[bool] = ..., catch_up: _Optional[bool] = ...) -> None: ...

class DraftStepResponse(_message.Message):
    __slots__ = ("step_id", "busy_s", "sent_bytes")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    busy_s: float
    sent_bytes: int
    def __init__(self, step_id: _Optional[int] = ..., busy_s: _Optional[float] = ..., sent_bytes: _Optional[int] = ...) -> None: ...

class VerifyItem(_message.Message):
    __slots__ = ("request_id", "num_draft", "source", "drop")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DROP_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_draft: int
    source: int
    drop: bool
    def __init__(self, request_id: _Optional[str] = ..., num_draft: _Optional[int] = ..., source: _Optional[int] = ..., drop: _Optional[bool] = ...) -> None: ...

class DraftSource(_message.Message):
    __slots__ = ("drafter_id", "draft_step_id")
    DRAFTER_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    drafter_id: str
    draft_step_id: int
    def __init__(self, drafter_id: _Optional[str] = ..., draft_step_id: _Optional[int] = ...) -> None: ...

class VerifyStepRequest(_message.Message):
    __slots__ = ("step_id", "new_requests", "finished", "items", "sources", "borrow_cpus", "after_step_id", "drafts_wait_s")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    BORROW_CPUS_FIELD_NUMBER: _ClassVar[int]
    AFTER_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    new_requests: _containers.RepeatedCompositeFieldContainer[NewRequest]
    finished: _containers.RepeatedScalarFieldContainer[str]
    items: _containers.RepeatedCompositeFieldContainer[VerifyItem]
    sources: _containers.RepeatedCompositeFieldContainer[DraftSource]
    borrow_cpus: bool
    after_step_id: int
    drafts_wait_s: float
    def __init__(self, step_id: _Optional[int] = ..., new_requests: _Optional[_Iterable[_Union[NewRequest, _Mapping]]] = ..., finished: _Optional[_Iterable[str]] = ..., items: _Optional[_Iterable[_Union[VerifyItem, _Mapping]]] = ..., sources: _Optional[_Iterable[_Union[DraftSource, _Mapping]]] = ..., borrow_cpus: _Optional[bool] = ..., after_step_id: _Optional[int] = ..., drafts_wait_s: _Optional[float] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("request_id", "token_ids", "num_draft")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_draft: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_draft: _Optional[int] = ...) -> None: ...

class VerifyStepResponse(_message.Message):
    __slots__ = ("step_id", "results", "busy_s", "recv_s", "borrowed", "drafts_wait_s")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    BUSY_S_FIELD_NUMBER: _ClassVar[int]
    RECV_S_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    DRAFTS_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    results: _containers.RepeatedCompositeFieldContainer[VerifyResult]
    busy_s: float
    recv_s: float
    borrowed: bool
    drafts_wait_s: float
    def __init__(self, step_id: _Optional[int] = ..., results: _Optional[_Iterable[_Union[VerifyResult, _Mapping]]] = ..., busy_s: _Optional[float] = ..., recv_s: _Optional[float] = ..., borrowed: _Optional[bool] = ..., drafts_wait_s: _Optional[float] = ...) -> None: ...

class DraftPayload(_message.Message):
    __slots__ = ("step_id", "drafter_id", "draft_token_ids", "num_tokens")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    drafter_id: str
    draft_token_ids: bytes
    num_tokens: int
    def __init__(self, step_id: _Optional[int] = ..., drafter_id: _Optional[str] = ..., draft_token_ids: _Optional[bytes] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class PutDraftsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AbandonDraftsRequest(_message.Message):
    __slots__ = ("drafter_id", "draft_step_id")
    DRAFTER_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_STEP_ID_FIELD_NUMBER: _ClassVar[int]
    drafter_id: str
    draft_step_id: int
    def __init__(self, drafter_id: _Optional[str] = ..., draft_step_id: _Optional[int] = ...) -> None: ...

class AbandonDraftsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("model", "vocab_size", "eos_token_ids", "max_model_len", "num_blocks", "block_size", "free_blocks", "dtype", "data_plane", "synthetic_acceptance", "drafter_id", "tp_size", "instance_id", "num_requests")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    SYNTHETIC_ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_ID_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_model_len: int
    num_blocks: int
    block_size: int
    free_blocks: int
    dtype: str
    data_plane: str
    synthetic_acceptance: float
    drafter_id: str
    tp_size: int
    instance_id: str
    num_requests: int
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., max_model_len: _Optional[int] = ..., num_blocks: _Optional[int] = ..., block_size: _Optional[int] = ..., free_blocks: _Optional[int] = ..., dtype: _Optional[str] = ..., data_plane: _Optional[str] = ..., synthetic_acceptance: _Optional[float] = ..., drafter_id: _Optional[str] = ..., tp_size: _Optional[int] = ..., instance_id: _Optional[str] = ..., num_requests: _Optional[int] = ...) -> None: ...

class ConnectDrafterRequest(_message.Message):
    __slots__ = ("drafter_id", "pairing_key")
    DRAFTER_ID_FIELD_NUMBER: _ClassVar[int]
    PAIRING_KEY_FIELD_NUMBER: _ClassVar[int]
    drafter_id: str
    pairing_key: str
    def __init__(self, drafter_id: _Optional[str] = ..., pairing_key: _Optional[str] = ...) -> None: ...

class ConnectDrafterResponse(_message.Message):
    __slots__ = ("data_plane", "address", "pairing_key")
    DATA_PLANE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PAIRING_KEY_FIELD_NUMBER: _ClassVar[int]
    data_plane: str
    address: str
    pairing_key: str
    def __init__(self, data_plane: _Optional[str] = ..., address: _Optional[str] = ..., pairing_key: _Optional[str] = ...) -> None: ...

class DisconnectDrafterRequest(_message.Message):
    __slots__ = ("drafter_id", "pairing_key")
    DRAFTER_ID_FIELD_NUMBER: _ClassVar[int]
    PAIRING_KEY_FIELD_NUMBER: _ClassVar[int]
    drafter_id: str
    pairing_key: str
    def __init__(self, drafter_id: _Optional[str] = ..., pairing_key: _Optional[str] = ...) -> None: ...

class DisconnectDrafterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
