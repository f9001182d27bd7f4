"""Tensor helpers for sampling: logits -> probabilities, per-request noise, sampling.

Randomness is keyed by (seed, position, stream) rather than drawn from one shared
generator, so a request's tokens do not depend on which other requests share its batch
or on how the Batch Manager split its work into steps. It is a counter-based hash
computed with integer tensor ops, not a torch.Generator, so the drafter and the verifier
get the same noise for a position even on different devices (identical bits; only the final
float log may round an ulp apart): coupled verification (rejection_sampler) needs that to
accept sampled drafts.
"""

from __future__ import annotations

import torch

# The noise that decides the token at a position: the target's race in the verifier and,
# with the very same noise, the drafter's guess of it (see rejection_sampler).
VERIFY_STREAM = 2

_MASK64 = (1 << 64) - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64's increment and mixing constants
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB


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
    value = (value + _GOLDEN_GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _MIX_1) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX_2) & _MASK64
    return value ^ (value >> 31)


def noise_key(seed: int, position: int, stream: int) -> int:
    """The 64-bit key of one (request seed, token position, stream).

    Hashing the three ints (splitmix64, chained) rather than adding them keeps nearby
    seeds and positions from sharing or overlapping random streams.
    """
    for name, value in (("seed", seed), ("position", position), ("stream", stream)):
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
    mixed = _splitmix64(seed & _MASK64)
    mixed = _splitmix64(mixed ^ (position & _MASK64))
    return _splitmix64(mixed ^ (stream & _MASK64))


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch stores it."""
    return value - (1 << 64) if value >> 63 else value


def _shift_right(bits: torch.Tensor, count: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> sign-extends)."""
    return (bits >> count).bitwise_and_((1 << (64 - count)) - 1)


def _splitmix64_bits(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Output number `counter` (1, 2, ...) of the SplitMix64 generator seeded with each key.

    keys [N, 1] and counters [1, C] int64 -> [N, C] int64 bit patterns. Integer ops wrap
    the same way on every device, so the bits do not depend on where they are computed.
    """
    bits = keys + counters * _signed(_GOLDEN_GAMMA)
    bits ^= _shift_right(bits, 30)
    bits *= _signed(_MIX_1)
    bits ^= _shift_right(bits, 27)
    bits *= _signed(_MIX_2)
    bits ^= _shift_right(bits, 31)
    return bits


def request_noise(
    seeds: list[int],  # [batch] one seed per request
    positions: list[list[int]],  # [batch][n_i] token positions that need noise
    stream: int,
    vocab_size: int,
    device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:  # uniform [total] float32, exponential [total, V] float32
    """Noise for each (request, position), rows in request order then position order.

    Row (seed, position, stream) is outputs 1..V+1 of the SplitMix64 generator seeded with
    noise_key: output 1 gives the uniform, output 2 + v token v's exponential. So a row
    is the same whatever else is in the batch, whichever device computes it (a drafter on
    CPU guesses the race of a verifier on an accelerator with the very same noise), and
    whatever the vocabulary size (a smaller vocabulary gets a prefix of the same row).
    The 53 high bits make a float64 u in (0, 1]; E = -log(u), rounded to float32 and
    clamped away from 0 so `probs / exponential` is never 0 / 0.
    """
    if len(seeds) != len(positions):
        raise ValueError(f"seeds has {len(seeds)} requests but positions has {len(positions)}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
    keys = [_signed(noise_key(seed, position, stream))
            for seed, request_positions in zip(seeds, positions) for position in request_positions]
    key_rows = torch.tensor(keys, dtype=torch.int64).reshape(-1, 1).to(device)  # [total, 1]
    counters = torch.arange(1, vocab_size + 2, dtype=torch.int64, device=device).unsqueeze(0)
    bits = _shift_right(_splitmix64_bits(key_rows, counters), 11)  # [total, V + 1] in [0, 2^53)
    unit = bits.add_(1).double().mul_(2.0**-53)  # (0, 1], exact
    uniform = unit[:, 0].float()
    exponential = unit[:, 1:].log_().neg_().float()
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
