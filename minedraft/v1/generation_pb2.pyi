from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingOptions(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "stop_token_ids", "stop", "ignore_eos", "seed", "max_draft")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    seed: int
    max_draft: int
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., seed: _Optional[int] = ..., max_draft: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "prompt_token_ids", "sampling", "request_id")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingOptions
    request_id: str
    def __init__(self, prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingOptions, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class AcceptanceStats(_message.Message):
    __slots__ = ("num_steps", "num_drafted", "num_accepted", "mean_acceptance_length", "acceptance_rate", "drafted_at", "accepted_at")
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFTED_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTANCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_AT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_AT_FIELD_NUMBER: _ClassVar[int]
    num_steps: int
    num_drafted: int
    num_accepted: int
    mean_acceptance_length: float
    acceptance_rate: float
    drafted_at: _containers.RepeatedScalarFieldContainer[int]
    accepted_at: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, num_steps: _Optional[int] = ..., num_drafted: _Optional[int] = ..., num_accepted: _Optional[int] = ..., mean_acceptance_length: _Optional[float] = ..., acceptance_rate: _Optional[float] = ..., drafted_at: _Optional[_Iterable[int]] = ..., accepted_at: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "stats", "prompt_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stats: AcceptanceStats
    prompt_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[AcceptanceStats, _Mapping]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "stats", "prompt_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stats: AcceptanceStats
    prompt_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[AcceptanceStats, _Mapping]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class ServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CostModel(_message.Message):
    __slots__ = ("draft_fixed_s", "draft_per_forward_s", "draft_per_token_s", "verify_fixed_s", "verify_per_token_s", "gateway_per_call_s", "draft_calls", "verify_calls", "median_error", "verify_borrowed_fixed_s", "verify_borrowed_per_token_s", "draft_per_new_token_s", "verify_per_new_token_s", "verify_borrowed_per_new_token_s", "prompt_tokens_per_s", "prompt_per_output", "verify_per_request_s", "verify_borrowed_per_request_s", "lending_judged", "data_plane_per_call_s")
    DRAFT_FIXED_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PER_FORWARD_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PER_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIXED_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_PER_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_PER_CALL_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_CALLS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_CALLS_FIELD_NUMBER: _ClassVar[int]
    MEDIAN_ERROR_FIELD_NUMBER: _ClassVar[int]
    VERIFY_BORROWED_FIXED_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_BORROWED_PER_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PER_NEW_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_PER_NEW_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_BORROWED_PER_NEW_TOKEN_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    PROMPT_PER_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    VERIFY_PER_REQUEST_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_BORROWED_PER_REQUEST_S_FIELD_NUMBER: _ClassVar[int]
    LENDING_JUDGED_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_PER_CALL_S_FIELD_NUMBER: _ClassVar[int]
    draft_fixed_s: float
    draft_per_forward_s: float
    draft_per_token_s: float
    verify_fixed_s: float
    verify_per_token_s: float
    gateway_per_call_s: float
    draft_calls: int
    verify_calls: int
    median_error: float
    verify_borrowed_fixed_s: float
    verify_borrowed_per_token_s: float
    draft_per_new_token_s: float
    verify_per_new_token_s: float
    verify_borrowed_per_new_token_s: float
    prompt_tokens_per_s: float
    prompt_per_output: float
    verify_per_request_s: float
    verify_borrowed_per_request_s: float
    lending_judged: float
    data_plane_per_call_s: float
    def __init__(self, draft_fixed_s: _Optional[float] = ..., draft_per_forward_s: _Optional[float] = ..., draft_per_token_s: _Optional[float] = ..., verify_fixed_s: _Optional[float] = ..., verify_per_token_s: _Optional[float] = ..., gateway_per_call_s: _Optional[float] = ..., draft_calls: _Optional[int] = ..., verify_calls: _Optional[int] = ..., median_error: _Optional[float] = ..., verify_borrowed_fixed_s: _Optional[float] = ..., verify_borrowed_per_token_s: _Optional[float] = ..., draft_per_new_token_s: _Optional[float] = ..., verify_per_new_token_s: _Optional[float] = ..., verify_borrowed_per_new_token_s: _Optional[float] = ..., prompt_tokens_per_s: _Optional[float] = ..., prompt_per_output: _Optional[float] = ..., verify_per_request_s: _Optional[float] = ..., verify_borrowed_per_request_s: _Optional[float] = ..., lending_judged: _Optional[float] = ..., data_plane_per_call_s: _Optional[float] = ...) -> None: ...

class AutoPlan(_message.Message):
    __slots__ = ("layout", "draft_lengths", "predicted_tokens_per_s", "layout_tokens_per_s", "acceptance_reach", "replans", "layout_switches", "layout_slowdown", "explorations", "layout_prefill_slowdown", "history", "acceptance_prior_strength", "request_trials", "acceptance_spread", "layout_delivered_tokens_per_s")
    class LayoutTokensPerSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LayoutSlowdownEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LayoutPrefillSlowdownEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class LayoutDeliveredTokensPerSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_REACH_FIELD_NUMBER: _ClassVar[int]
    REPLANS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_SWITCHES_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    EXPLORATIONS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_PREFILL_SLOWDOWN_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_PRIOR_STRENGTH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_TRIALS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_SPREAD_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_DELIVERED_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    layout: str
    draft_lengths: _containers.RepeatedScalarFieldContainer[int]
    predicted_tokens_per_s: float
    layout_tokens_per_s: _containers.ScalarMap[str, float]
    acceptance_reach: _containers.RepeatedScalarFieldContainer[float]
    replans: int
    layout_switches: int
    layout_slowdown: _containers.ScalarMap[str, float]
    explorations: int
    layout_prefill_slowdown: _containers.ScalarMap[str, float]
    history: _containers.RepeatedCompositeFieldContainer[PlanDecision]
    acceptance_prior_strength: float
    request_trials: int
    acceptance_spread: float
    layout_delivered_tokens_per_s: _containers.ScalarMap[str, float]
    def __init__(self, layout: _Optional[str] = ..., draft_lengths: _Optional[_Iterable[int]] = ..., predicted_tokens_per_s: _Optional[float] = ..., layout_tokens_per_s: _Optional[_Mapping[str, float]] = ..., acceptance_reach: _Optional[_Iterable[float]] = ..., replans: _Optional[int] = ..., layout_switches: _Optional[int] = ..., layout_slowdown: _Optional[_Mapping[str, float]] = ..., explorations: _Optional[int] = ..., layout_prefill_slowdown: _Optional[_Mapping[str, float]] = ..., history: _Optional[_Iterable[_Union[PlanDecision, _Mapping]]] = ..., acceptance_prior_strength: _Optional[float] = ..., request_trials: _Optional[int] = ..., acceptance_spread: _Optional[float] = ..., layout_delivered_tokens_per_s: _Optional[_Mapping[str, float]] = ...) -> None: ...

class PlanDecision(_message.Message):
    __slots__ = ("at_s", "layout", "trying", "requests", "layout_tokens_per_s")
    class LayoutTokensPerSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    AT_S_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    TRYING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    at_s: float
    layout: str
    trying: str
    requests: int
    layout_tokens_per_s: _containers.ScalarMap[str, float]
    def __init__(self, at_s: _Optional[float] = ..., layout: _Optional[str] = ..., trying: _Optional[str] = ..., requests: _Optional[int] = ..., layout_tokens_per_s: _Optional[_Mapping[str, float]] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "mode", "k", "target_model", "draft_model", "max_batch", "num_drafters", "synthetic_acceptance", "cost_model", "plan")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODEL_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFTERS_FIELD_NUMBER: _ClassVar[int]
    SYNTHETIC_ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    COST_MODEL_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    version: str
    mode: str
    k: int
    target_model: str
    draft_model: str
    max_batch: int
    num_drafters: int
    synthetic_acceptance: float
    cost_model: CostModel
    plan: AutoPlan
    def __init__(self, version: _Optional[str] = ..., mode: _Optional[str] = ..., k: _Optional[int] = ..., target_model: _Optional[str] = ..., draft_model: _Optional[str] = ..., max_batch: _Optional[int] = ..., num_drafters: _Optional[int] = ..., synthetic_acceptance: _Optional[float] = ..., cost_model: _Optional[_Union[CostModel, _Mapping]] = ..., plan: _Optional[_Union[AutoPlan, _Mapping]] = ...) -> None: ...

class StepStatsRequest(_message.Message):
    __slots__ = ("max_steps",)
    MAX_STEPS_FIELD_NUMBER: _ClassVar[int]
    max_steps: int
    def __init__(self, max_steps: _Optional[int] = ...) -> None: ...

class StepRecord(_message.Message):
    __slots__ = ("step_id", "kind", "start_s", "wall_s", "draft_busy_s", "verify_busy_s", "data_plane_s", "data_plane_bytes", "draft_batch", "verify_batch", "layout", "draft_lengths", "predicted_busy_s", "borrowed")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    START_S_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    DRAFT_BUSY_S_FIELD_NUMBER: _ClassVar[int]
    VERIFY_BUSY_S_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_S_FIELD_NUMBER: _ClassVar[int]
    DATA_PLANE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAFT_BATCH_FIELD_NUMBER: _ClassVar[int]
    VERIFY_BATCH_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    DRAFT_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_BUSY_S_FIELD_NUMBER: _ClassVar[int]
    BORROWED_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    kind: str
    start_s: float
    wall_s: float
    draft_busy_s: float
    verify_busy_s: float
    data_plane_s: float
    data_plane_bytes: int
    draft_batch: int
    verify_batch: int
    layout: str
    draft_lengths: _containers.RepeatedScalarFieldContainer[int]
    predicted_busy_s: float
    borrowed: bool
    def __init__(self, step_id: _Optional[int] = ..., kind: _Optional[str] = ..., start_s: _Optional[float] = ..., wall_s: _Optional[float] = ..., draft_busy_s: _Optional[float] = ..., verify_busy_s: _Optional[float] = ..., data_plane_s: _Optional[float] = ..., data_plane_bytes: _Optional[int] = ..., draft_batch: _Optional[int] = ..., verify_batch: _Optional[int] = ..., layout: _Optional[str] = ..., draft_lengths: _Optional[_Iterable[int]] = ..., predicted_busy_s: _Optional[float] = ..., borrowed: _Optional[bool] = ...) -> None: ...

class StepStats(_message.Message):
    __slots__ = ("steps",)
    STEPS_FIELD_NUMBER: _ClassVar[int]
    steps: _containers.RepeatedCompositeFieldContainer[StepRecord]
    def __init__(self, steps: _Optional[_Iterable[_Union[StepRecord, _Mapping]]] = ...) -> None: ...

class DrafterEndpoint(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class DrafterStatus(_message.Message):
    __slots__ = ("address", "drafter_id", "num_requests", "reserved_blocks", "num_blocks", "requests_assigned")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    address: str
    drafter_id: str
    num_requests: int
    reserved_blocks: int
    num_blocks: int
    requests_assigned: int
    def __init__(self, address: _Optional[str] = ..., drafter_id: _Optional[str] = ..., num_requests: _Optional[int] = ..., reserved_blocks: _Optional[int] = ..., num_blocks: _Optional[int] = ..., requests_assigned: _Optional[int] = ...) -> None: ...

class ListDraftersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ("drafters",)
    DRAFTERS_FIELD_NUMBER: _ClassVar[int]
    drafters: _containers.RepeatedCompositeFieldContainer[DrafterStatus]
    def __init__(self, drafters: _Optional[_Iterable[_Union[DrafterStatus, _Mapping]]] = ...) -> None: ...
