"""Conversions between protobuf messages and the library's plain types. No torch here."""

from __future__ import annotations

from minedraft.metrics import AcceptanceStats
from minedraft.sampling_params import SamplingParams
from minedraft.v1 import engine_pb2, generation_pb2

DEFAULT_MAX_TOKENS = 64


def params_from_proto(options: generation_pb2.SamplingOptions) -> SamplingParams:
    """Proto3 zero values mean "unset": top_p 0 -> 1.0, max_tokens 0 -> the default.

    Raises ValueError naming the field (prefixed with `sampling.`) on bad values.
    """
    try:
        return SamplingParams(
            temperature=options.temperature,
            top_p=options.top_p if options.top_p != 0 else 1.0,
            top_k=options.top_k,
            max_tokens=options.max_tokens if options.max_tokens != 0 else DEFAULT_MAX_TOKENS,
            stop_token_ids=tuple(options.stop_token_ids),
            stop=tuple(options.stop),
            ignore_eos=options.ignore_eos,
            seed=options.seed if options.HasField("seed") else None,
        )
    except ValueError as err:
        raise ValueError(f"sampling.{err}") from None


def params_to_proto(params: SamplingParams) -> generation_pb2.SamplingOptions:
    options = generation_pb2.SamplingOptions(
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        max_tokens=params.max_tokens, stop_token_ids=list(params.stop_token_ids),
        stop=list(params.stop), ignore_eos=params.ignore_eos)
    if params.seed is not None:
        options.seed = params.seed
    return options


def new_request_proto(request_id: str, token_ids: list[int], params: SamplingParams,
                      seed: int) -> engine_pb2.NewRequest:
    return engine_pb2.NewRequest(request_id=request_id, token_ids=token_ids,
                                 sampling=params_to_proto(params), seed=seed)


def stats_to_proto(stats: AcceptanceStats) -> generation_pb2.AcceptanceStats:
    return generation_pb2.AcceptanceStats(
        num_steps=stats.num_steps, num_drafted=stats.num_drafted, num_accepted=stats.num_accepted,
        mean_acceptance_length=stats.mean_acceptance_length, acceptance_rate=stats.acceptance_rate,
        drafted_at=stats.drafted_at, accepted_at=stats.accepted_at)


def engine_info(requests, model_name: str, data_plane: str, instance_id: str,
                synthetic_acceptance: float | None = None) -> engine_pb2.EngineInfo:
    """GetInfo answer of a drafter or verifier (`requests`: its RequestTable): what the
    gateway sizes its admission by, and what tests and operators check state by."""
    runner = requests.runner
    cfg = runner.model_config
    return engine_pb2.EngineInfo(
        model=model_name, vocab_size=cfg.vocab_size, eos_token_ids=list(cfg.eos_token_ids),
        max_model_len=cfg.max_position, num_blocks=runner.config.num_blocks,
        block_size=runner.config.block_size, free_blocks=runner.blocks.num_free_blocks,
        dtype=runner.config.dtype, data_plane=data_plane, instance_id=instance_id,
        num_requests=len(requests), synthetic_acceptance=synthetic_acceptance or 0.0)
