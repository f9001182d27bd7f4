"""MineDraft: LLM serving with speculative decoding."""
