"""MineDraft: LLM serving with batch-parallel speculative decoding."""

__version__ = "0.1.0"
