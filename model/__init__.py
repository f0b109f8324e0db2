"""A decoder-only Transformer language model, built from scaled dot-product attention."""

from .config import GPTConfig
from .gpt import GPT, evaluating
from .sampling import Sampling

__all__ = ["GPT", "GPTConfig", "Sampling", "evaluating"]
