"""Tensor helpers for sampling: logits -> probabilities, per-request noise, sampling.

Randomness is keyed by (seed, position, stream) rather than drawn from one shared
generator, so a request's tokens do not depend on which other requests share its batch
or on how the Batch Manager split its work into steps.
"""

from __future__ import annotations

import torch

DRAFT_STREAM = 1  # noise the drafter uses to sample draft tokens
VERIFY_STREAM = 2  # noise the rejection sampler uses to accept and resample

_MASK64 = (1 << 64) - 1


def processed_probs(
    logits: torch.Tensor,  # [N, V] float
    temperature: torch.Tensor,  # [N] float, 0 = greedy
    top_k: torch.Tensor | None,  # [N] int64, 0 = off; None = off for every row
    top_p: torch.Tensor | None,  # [N] float, 1 = off; None = off for every row
) -> torch.Tensor:  # [N, V] float32
    """The distribution each row actually samples from, after temperature, top-k, top-p.

    Greedy rows (temperature 0) become the one-hot of their argmax, so the rejection
    sampler can treat greedy and sampled requests alike.

    Sorting is the expensive part, so it is skipped when no row filters. Pass None for
    top_k / top_p to skip it without looking at the tensor: the caller knows from the
    requests' SamplingParams on the host, whereas checking a device tensor would cost a
    host sync. A CPU tensor whose rows are all off is also skipped.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [N, V], got shape {tuple(logits.shape)}")
    num_rows, vocab_size = logits.shape
    for name, tensor in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if tensor is not None and tuple(tensor.shape) != (num_rows,):
            raise ValueError(f"{name} must be [{num_rows}], got shape {tuple(tensor.shape)}")

    logits = logits.float()
    is_greedy = temperature == 0
    safe_temperature = torch.where(is_greedy, torch.ones_like(temperature), temperature)
    scaled = logits / safe_temperature.to(logits.dtype).unsqueeze(1)

    use_top_k = top_k is not None and not _all_off(top_k > 0)
    use_top_p = top_p is not None and not _all_off(top_p < 1)
    if use_top_k or use_top_p:
        scaled = _filter_top_k_top_p(
            scaled, top_k if use_top_k else None, top_p if use_top_p else None
        )
    probs = torch.softmax(scaled, dim=-1)

    greedy_one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(is_greedy.unsqueeze(1), greedy_one_hot, probs)


def _all_off(row_uses_filter: torch.Tensor) -> bool:
    # Only CPU tensors are inspected: on an accelerator this would be a host sync.
    return row_uses_filter.device.type == "cpu" and not bool(row_uses_filter.any())


def _filter_top_k_top_p(
    scaled: torch.Tensor,  # [N, V] float32, temperature-scaled logits
    top_k: torch.Tensor | None,  # [N] int64, 0 = off
    top_p: torch.Tensor | None,  # [N] float, 1 = off
) -> torch.Tensor:  # [N, V] float32, filtered-out tokens set to -inf
    """One sort serves both filters; masking by rank keeps exactly k tokens even on ties."""
    # Stable, so equal logits keep vocabulary order and the result is reproducible.
    sorted_logits, sorted_index = torch.sort(scaled, dim=-1, descending=True, stable=True)
    rank = torch.arange(scaled.shape[1], device=scaled.device).unsqueeze(0)  # [1, V]
    if top_k is not None:
        k = top_k.to(scaled.device).unsqueeze(1)  # [N, 1]
        sorted_logits = sorted_logits.masked_fill((k > 0) & (rank >= k), float("-inf"))
    if top_p is not None:
        p = top_p.to(device=scaled.device, dtype=scaled.dtype).unsqueeze(1)  # [N, 1]
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        # Mass strictly above each token: keep a token while what precedes it is short of
        # top_p. That is the smallest nucleus reaching top_p, and always keeps rank 0.
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        sorted_logits = sorted_logits.masked_fill((p < 1) & (mass_before >= p), float("-inf"))
    return torch.empty_like(scaled).scatter_(1, sorted_index, sorted_logits)


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def position_generator(
    seed: int, position: int, stream: int, device: torch.device | str
) -> torch.Generator:
    """A generator owned by one (request seed, token position, stream).

    Hashing the three ints (splitmix64, chained) rather than adding them keeps nearby
    seeds and positions from sharing or overlapping random streams.
    """
    for name, value in (("seed", seed), ("position", position), ("stream", stream)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    mixed = _splitmix64(seed & _MASK64)
    mixed = _splitmix64(mixed ^ (position & _MASK64))
    mixed = _splitmix64(mixed ^ (stream & _MASK64))
    generator = torch.Generator(device=device)
    generator.manual_seed(mixed >> 1)  # 63 bits: fits every torch seed convention
    return generator


def request_noise(
    seeds: list[int],  # [batch] one seed per request
    positions: list[list[int]],  # [batch][n_i] token positions that need noise
    stream: int,
    vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:  # uniform [total] float32, exponential [total, V] float32
    """Noise for each (request, position), rows in request order then position order.

    Each row has its own generator, so the same (seed, position, stream) always yields the
    same row whatever else is in the batch. Uniforms lie in (0, 1]: excluding 0 means
    `uniform * q <= p` can never accept a token the target gives zero probability.
    Exponentials are clamped away from 0 so `probs / exponential` is never 0 / 0.
    """
    if len(seeds) != len(positions):
        raise ValueError(f"seeds has {len(seeds)} requests but positions has {len(positions)}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    total = sum(len(request_positions) for request_positions in positions)
    uniform = torch.empty(total, dtype=torch.float32, device=device)
    exponential = torch.empty(total, vocab_size, dtype=torch.float32, device=device)
    row = 0
    for seed, request_positions in zip(seeds, positions):
        for position in request_positions:
            generator = position_generator(seed, position, stream, device)
            uniform[row : row + 1].uniform_(generator=generator)
            exponential[row].exponential_(generator=generator)
            row += 1
    uniform = 1.0 - uniform  # [0, 1) -> (0, 1]
    exponential.clamp_(min=torch.finfo(torch.float32).tiny)
    return uniform, exponential


def sample_with_noise(
    probs: torch.Tensor,  # [N, V] float, rows need not be normalised
    exponential: torch.Tensor,  # [N, V] float, i.i.d. Exp(1)
) -> torch.Tensor:  # [N] int64
    """Draw one token per row from probs, exactly, without a host sync.

    Why it is exact (the exponential race): E_v / p_v is Exp(rate p_v), independent over v.
    The minimum of independent exponentials falls on v with probability p_v / sum(p), so
    argmin(E / p) = argmax(p / E) is a sample from the normalised probs. This is Gumbel-max
    in disguise (-log E is Gumbel) and needs neither a cumsum nor torch.multinomial's sync.
    Zero-probability tokens score 0 and are never picked while any token has mass.
    """
    if probs.shape != exponential.shape:
        raise ValueError(
            f"probs {tuple(probs.shape)} and exponential {tuple(exponential.shape)} must match"
        )
    return (probs / exponential).argmax(dim=-1)
