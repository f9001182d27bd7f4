"""Lossless rejection sampling for speculative decoding.

Terms, per request with k draft tokens:
  accepted  - the leading draft tokens the target agrees to keep (0..k of them).
  recovered - the token emitted at the first rejected draft position, drawn from the
              residual max(p - q, 0) so the output is distributed exactly as the target's p.
  bonus     - the token emitted when all k drafts are accepted, drawn from the target's
              distribution at the position after the last draft (the target computed it anyway).
Every request therefore emits its accepted tokens plus exactly one recovered or bonus token,
1..k+1 tokens in all.

The sampler is a pure function of its tensors: all randomness comes in as `uniform` and
`exponential`, so a caller that keys noise by (seed, position) gets outputs that do not
depend on batching.
"""

from __future__ import annotations

import torch

from minedraft.sampling import sample_with_noise


def rejection_sample(
    draft_token_ids: torch.Tensor,  # [num_draft_tokens] int64, requests' drafts concatenated
    num_draft_tokens: list[int],  # [batch] draft length k_i of each request (may be 0)
    draft_probs: torch.Tensor | None,  # [num_draft_tokens, V]; None = greedy drafter (one-hot)
    target_probs: torch.Tensor,  # [num_draft_tokens + batch, V]; request i: k_i rows, then bonus
    is_greedy: torch.Tensor,  # [batch] bool, target temperature 0 (target rows are one-hot)
    uniform: torch.Tensor,  # [num_draft_tokens + batch] one per target row (draft rows used)
    exponential: torch.Tensor,  # [num_draft_tokens + batch, V] Exp(1) noise per target row
) -> list[list[int]]:  # per request: accepted drafts + one recovered or bonus token
    """Verify every request's drafts in one vectorized pass; the only host sync is at the end.

    Greedy request: accept while the draft equals the target argmax; emit the argmax at the
    first mismatch or at the bonus row.
    Sampled request: accept draft x with probability min(1, p(x) / q(x)); at the first
    rejection emit a sample of max(p - q, 0) (or of p if that is all zero, i.e. p == q);
    if all are accepted, emit a sample of p at the bonus row.
    """
    batch = len(num_draft_tokens)
    total_drafts = _validate(
        draft_token_ids, num_draft_tokens, draft_probs, target_probs, is_greedy, uniform,
        exponential,
    )
    if batch == 0:
        return []
    device = target_probs.device
    vocab_size = target_probs.shape[1]

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

    draft_lengths = draft_lengths.to(device, non_blocking=True)
    draft_starts = draft_starts.to(device, non_blocking=True)
    target_starts = target_starts.to(device, non_blocking=True)
    slot_valid = slot_valid.to(device, non_blocking=True)
    padded_draft_rows = padded_draft_rows.to(device, non_blocking=True)
    request_of_draft = request_of_draft.to(device, non_blocking=True)
    target_rows_of_drafts = target_rows_of_drafts.to(device, non_blocking=True)
    is_greedy = is_greedy.to(device)

    # Acceptance of each draft token, on the flat [num_draft_tokens] layout.
    draft_target_probs = target_probs[target_rows_of_drafts]  # [num_draft_tokens, V]
    target_prob_of_draft = draft_target_probs.gather(1, draft_token_ids.unsqueeze(1)).squeeze(1)
    if draft_probs is None:
        draft_prob_of_draft = torch.ones_like(target_prob_of_draft)
    else:
        draft_prob_of_draft = draft_probs.gather(1, draft_token_ids.unsqueeze(1)).squeeze(1)
    # u in (0, 1]: accept iff u * q(x) <= p(x). The p(x) > 0 term makes q(x) = 0 (a draft
    # the drafter could not have sampled) accept only tokens the target allows.
    draft_uniform = uniform[target_rows_of_drafts]  # [num_draft_tokens]
    sampled_accept = (draft_uniform * draft_prob_of_draft <= target_prob_of_draft) & (
        target_prob_of_draft > 0
    )
    greedy_accept = draft_token_ids == draft_target_probs.argmax(dim=-1)
    accepted = torch.where(is_greedy[request_of_draft], greedy_accept, sampled_accept)

    # Leading run of acceptances per request; padding slots count as rejections.
    padded_accepted = accepted[padded_draft_rows] & slot_valid  # [batch, max_k]
    num_accepted = torch.cumprod(padded_accepted.to(torch.int64), dim=1).sum(dim=1)  # [batch]
    is_recovered = num_accepted < draft_lengths  # [batch]; False = bonus

    # The one row per request where the emitted token is drawn.
    final_target_rows = target_starts + num_accepted  # [batch]
    final_target_probs = target_probs[final_target_rows]  # [batch, V]
    if total_drafts > 0:
        rejected_draft_rows = (draft_starts + num_accepted).clamp(max=total_drafts - 1)
        if draft_probs is None:
            rejected_draft_probs = torch.nn.functional.one_hot(
                draft_token_ids[rejected_draft_rows], vocab_size
            ).to(final_target_probs.dtype)
        else:
            rejected_draft_probs = draft_probs[rejected_draft_rows]  # [batch, V]
        residual = (final_target_probs - rejected_draft_probs).clamp(min=0)
        # All-zero residual only when p == q, where rejection has probability 0 anyway.
        residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, final_target_probs)
        final_dist = torch.where(is_recovered.unsqueeze(1), residual, final_target_probs)
    else:
        final_dist = final_target_probs
    sampled_token = sample_with_noise(final_dist, exponential[final_target_rows])
    greedy_token = final_target_probs.argmax(dim=-1)
    final_token = torch.where(is_greedy, greedy_token, sampled_token)  # [batch]

    padded_drafts = torch.where(slot_valid, draft_token_ids[padded_draft_rows], 0)  # [batch, max_k]
    packed = torch.cat(
        [padded_drafts, final_token.unsqueeze(1), num_accepted.unsqueeze(1)], dim=1
    ).tolist()  # the single host sync
    return [row[: row[max_k + 1]] + [row[max_k]] for row in packed]


def _validate(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    is_greedy: torch.Tensor,
    uniform: torch.Tensor,
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
        "uniform": (uniform, (total + batch,)),
        "exponential": (exponential, (total + batch, vocab_size)),
    }
    if draft_probs is not None:
        expected["draft_probs"] = (draft_probs, (total, vocab_size))
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
