"""DataConfig: where the text comes from and how it becomes tokens, checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass

from .sources import DataError
from .tokenizer import BYTE_ALPHABET, EOT, KINDS


@dataclass
class DataConfig:
    """The `data:` section of a run config."""

    source: str = "shakespeare"  # built in (or copies, the induction lesson's); a .txt/.jsonl/.csv/.parquet file, a folder of one kind of them, or hf:<name>
    tokenizer: str = "char"  # char (one token per character) or bpe (byte-level BPE)
    vocab_size: int = 4096  # bpe only
    text_field: str = "text"  # the column holding the text in .jsonl/.csv/.parquet files and datasets
    val_fraction: float = 0.1  # the share of the text held out for validation
    cache_dir: str | None = None  # where token files go; default ~/.cache/tinygpt/tokens (data/prepare.py)
    hf_split: str = "train"  # hf: sources: the dataset's split to read, as load_dataset names it ("train[:10%]")
    hf_data_files: str | None = None  # hf: sources: only the files matching this pattern ("en/*.parquet")
    chat_too_long: str = "cut"  # conversations longer than the context: cut at the end, or refuse the run

    def __post_init__(self) -> None:
        if self.tokenizer not in KINDS:
            raise DataError(f"data.tokenizer={self.tokenizer!r}: must be one of {', '.join(KINDS)}")
        if self.tokenizer == "bpe" and self.vocab_size < BYTE_ALPHABET + 1:
            raise DataError(f"data.vocab_size={self.vocab_size} is below the {BYTE_ALPHABET} byte tokens "
                            f"byte-level BPE starts from, plus {EOT}; use at least {BYTE_ALPHABET + 1}")
        if self.chat_too_long not in ("cut", "refuse"):
            raise DataError(f"data.chat_too_long={self.chat_too_long!r}: must be cut or refuse")
        if not 0.0 < self.val_fraction < 1.0:
            raise DataError(f"data.val_fraction={self.val_fraction}: must be between 0 and 1, e.g. 0.1")
        if not self.source.startswith("hf:") and (self.hf_split != "train" or self.hf_data_files is not None):
            raise DataError(f"data.hf_split and data.hf_data_files choose within an hf: dataset; data.source="
                            f"{self.source!r} is not one: remove them")
