"""A decoder-only Transformer language model, built from scaled dot-product attention."""

from .config import GPTConfig
from .gpt import GPT, evaluating, in_mode
from .sampling import Sampling

__all__ = ["GPT", "GPTConfig", "Sampling", "evaluating", "in_mode"]
