"""Data: corpora, tokenizers, token files and batches. Knows nothing of the model."""

from .batches import BatchSampler, fixed_windows
from .config import DataConfig
from .prepare import TokenData, content_digest, discard, prepare
from .sources import DataError
from .tokenizer import load_tokenizer, unknown_characters

__all__ = ["BatchSampler", "DataConfig", "DataError", "TokenData", "content_digest", "discard", "fixed_windows",
           "load_tokenizer", "prepare", "unknown_characters"]
