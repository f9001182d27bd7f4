"""Lossless verification of drafts by coupled sampling: the drafter and the target race on
the same noise, and a draft is kept only where it is the target's own sample.

Terms, per request with k draft tokens:
  target token - per target row, the token plain decoding would emit at that position: the
              argmax for a greedy request, else the winner of the exponential race
              argmax(p / E) with E the row's noise, keyed by (seed, position).
  accepted  - the leading drafts equal to their row's target token (0..k of them).
  recovered - the target token at the first draft that differs from it.
  bonus     - the target token at the row after the last draft, when all k are accepted.
Every request therefore emits its accepted tokens plus exactly one recovered or bonus token,
1..k+1 tokens in all.

Why coupled rather than the classic rule (accept x with probability min(1, p(x) / q(x)),
resample max(p - q, 0) at the first rejection): every token emitted is the target token of
its row, so a sampled request emits exactly what plain decoding with the same seed emits,
whatever k each step used, even k chosen from timings. That is lossless by construction
(each token is a sample of p) and reproducible (as exactly as the target's logits are: a
race decided by float rounding can flip, as a greedy near-tie can). The drafter samples
its draft at position P as argmax(q / E) with the very same E, so it often agrees.

The price: a sampled draft is accepted with probability P(the two races agree) =
sum_v 1 / sum_w max(p_w / p_v, q_w / q_v), at most the classic rule's 1 - TV(p, q) (no
coupling beats it) and at least (1 - TV) / (1 + TV). On the bundled pair at k = 4 the mean
acceptance length fell from 3.22 to 2.80 at temperature 1.0 and from 3.34 to 3.02 at 0.7.
Greedy requests are unchanged: their target token is the argmax.

The sampler is a pure function of its tensors: all randomness comes in as `exponential`,
so a caller that keys noise by (seed, position) gets outputs that do not depend on
batching. Draft probabilities are not needed: only the drafts' tokens are compared.
"""

from __future__ import annotations

import torch

from minedraft.sampling import sample_with_noise


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [num_draft_tokens] int64, requests' drafts concatenated
    num_draft_tokens: list[int],  # [batch] draft length k_i of each request (may be 0)
    target_probs: torch.Tensor,  # [num_draft_tokens + batch, V]; request i: k_i rows, then bonus
    is_greedy: torch.Tensor,  # [batch] bool, target temperature 0 (target rows are one-hot)
    exponential: torch.Tensor,  # [num_draft_tokens + batch, V] Exp(1) noise per target row
) -> list[list[int]]:  # per request: accepted drafts + one recovered or bonus token
    """Verify every request's drafts in one vectorized pass; the only host sync is at the end.

    Each target row's token is the argmax (greedy request) or argmax(p / E) (sampled
    request), exactly as plain decoding picks it at that position. Accept drafts while
    they equal their row's target token; emit the target token at the first mismatch or
    at the bonus row. For the sampled drafts to be accepted often, the drafter must have
    drawn them as argmax(q / E) with the same `exponential` rows: the verdict never
    depends on how the drafts were drawn, only the acceptance rate does.
    """
    batch = len(num_draft_tokens)
    total_drafts = _validate(draft_token_ids, num_draft_tokens, target_probs, is_greedy, exponential)
    if batch == 0:
        return []
    device = target_probs.device

    # Host-side index bookkeeping from plain ints: no device reads needed.
    draft_lengths = torch.tensor(num_draft_tokens, dtype=torch.int64)  # [batch]
    draft_starts = torch.cumsum(draft_lengths, 0) - draft_lengths  # [batch]
    target_starts = draft_starts + torch.arange(batch)  # [batch], each request adds a bonus row
    max_k = max(num_draft_tokens)
    slot = torch.arange(max_k).unsqueeze(0)  # [1, max_k]
    slot_valid = slot < draft_lengths.unsqueeze(1)  # [batch, max_k]
    padded_draft_rows = torch.where(slot_valid, draft_starts.unsqueeze(1) + slot, 0)
    request_of_draft = torch.repeat_interleave(torch.arange(batch), draft_lengths)
    target_rows_of_drafts = torch.arange(total_drafts) + request_of_draft  # [num_draft_tokens]
    request_of_target_row = torch.repeat_interleave(torch.arange(batch), draft_lengths + 1)

    draft_lengths = draft_lengths.to(device, non_blocking=True)
    target_starts = target_starts.to(device, non_blocking=True)
    slot_valid = slot_valid.to(device, non_blocking=True)
    padded_draft_rows = padded_draft_rows.to(device, non_blocking=True)
    target_rows_of_drafts = target_rows_of_drafts.to(device, non_blocking=True)
    request_of_target_row = request_of_target_row.to(device, non_blocking=True)
    is_greedy = is_greedy.to(device)

    # What plain decoding emits at every target row: [num_draft_tokens + batch].
    greedy_tokens = target_probs.argmax(dim=-1)
    sampled_tokens = sample_with_noise(target_probs, exponential)
    target_tokens = torch.where(is_greedy[request_of_target_row], greedy_tokens, sampled_tokens)

    # Leading run of drafts equal to their row's target token; padding slots count as misses.
    accepted = draft_token_ids == target_tokens[target_rows_of_drafts]  # [num_draft_tokens]
    padded_accepted = accepted[padded_draft_rows] & slot_valid  # [batch, max_k]
    num_accepted = torch.cumprod(padded_accepted.to(torch.int64), dim=1).sum(dim=1)  # [batch]
    final_token = target_tokens[target_starts + num_accepted]  # [batch] recovered or bonus

    padded_drafts = torch.where(slot_valid, draft_token_ids[padded_draft_rows], 0)  # [batch, max_k]
    packed = torch.cat(
        [padded_drafts, final_token.unsqueeze(1), num_accepted.unsqueeze(1)], dim=1
    ).tolist()  # the single host sync
    return [row[: row[max_k + 1]] + [row[max_k]] for row in packed]


def _validate(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    target_probs: torch.Tensor,
    is_greedy: torch.Tensor,
    exponential: torch.Tensor,
) -> int:
    """Check every shape against num_draft_tokens; return the total draft count."""
    if any(k < 0 for k in num_draft_tokens):
        raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
    batch = len(num_draft_tokens)
    total = sum(num_draft_tokens)
    if target_probs.dim() != 2:
        raise ValueError(f"target_probs must be [rows, V], got shape {tuple(target_probs.shape)}")
    vocab_size = target_probs.shape[1]
    expected = {
        "draft_token_ids": (draft_token_ids, (total,)),
        "target_probs": (target_probs, (total + batch, vocab_size)),
        "is_greedy": (is_greedy, (batch,)),
        "exponential": (exponential, (total + batch, vocab_size)),
    }
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(
                f"{name} must have shape {shape} for num_draft_tokens={num_draft_tokens} "
                f"and vocab {vocab_size}, got {tuple(tensor.shape)}"
            )
    if draft_token_ids.dtype != torch.int64:
        raise ValueError(f"draft_token_ids must be int64, got {draft_token_ids.dtype}")
    if is_greedy.dtype != torch.bool:
        raise ValueError(f"is_greedy must be bool, got {is_greedy.dtype}")
    return total
