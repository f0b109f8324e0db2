"""DataConfig: where the text comes from and how it becomes tokens, checked when it is made."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .shared import DataError
from .tokenizer import KINDS


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
    hf_val_split: str = "auto"  # hf: sources: the split to validate on; auto: the dataset's validation (or test)
    # split where it has one and data.hf_split is train, else a cut of data.val_fraction; none: always the cut
    chat_too_long: str = "cut"  # conversations longer than the context: cut at the end, or refuse the run
    unencodable: float = 0.0  # the share of the text's characters a given tokenizer may be unable to write (dropped:
    # counted and named per character); more refuses the data, and 0 refuses any (data/tokenizer.py: Unencodable)
    skip_bad_records: float = 0.01  # conversations: the share of records that may be skipped as bad, each counted
    # by its reason and the first named (more refuses the source; 0 refuses the first), data/conversations.py
    sources: list | None = None  # a mixture of conversations: each a source as data.source takes it, or
    # {source: ..., weight: 2.0, hf_split: ..., hf_data_files: ...}; weight: how often its conversations come in an epoch

    def __post_init__(self) -> None:
        if self.tokenizer not in KINDS:
            raise DataError(f"data.tokenizer={self.tokenizer!r}: must be one of {', '.join(KINDS)}")
        if self.chat_too_long not in ("cut", "refuse"):
            raise DataError(f"data.chat_too_long={self.chat_too_long!r}: must be cut or refuse")
        if isinstance(self.skip_bad_records, bool) or not isinstance(self.skip_bad_records, (int, float)) \
                or not 0.0 <= self.skip_bad_records < 1.0:
            raise DataError(f"data.skip_bad_records={self.skip_bad_records!r}: must be a share from 0 (refuse any bad "
                            "record) up to 1, e.g. 0.01")
        if isinstance(self.unencodable, bool) or not isinstance(self.unencodable, (int, float)) \
                or not 0.0 <= self.unencodable < 1.0:
            raise DataError(f"data.unencodable={self.unencodable!r}: must be a share from 0 (refuse any character the "
                            "tokenizer cannot write) up to 1, e.g. 0.001")
        if not 0.0 < self.val_fraction < 1.0:
            raise DataError(f"data.val_fraction={self.val_fraction}: must be between 0 and 1, e.g. 0.1")
        if self.sources is not None:
            self.check_mixture()
        elif self.source == MIXTURE:
            raise DataError(f"data.source={MIXTURE} names the conversations of data.sources, which is not set: give "
                            "data.sources, or another data.source")
        if not self.source.startswith("hf:") and (self.hf_split != "train" or self.hf_data_files is not None
                                                  or self.hf_val_split != "auto"):
            raise DataError(f"data.hf_split, data.hf_val_split and data.hf_data_files choose within an hf: dataset; "
                            f"data.source={self.source!r} is not one: remove them")

    def check_mixture(self) -> None:
        """data.sources: a list of sources (text, or {source, weight, hf_split, hf_data_files});
        data.source then reads "mixture"."""
        if not isinstance(self.sources, list) or not self.sources:
            raise DataError("data.sources must be a list of sources, e.g. [a.jsonl, {source: hf:org/name, weight: 0.5}]")
        if self.source not in (MIXTURE, DataConfig.source):
            raise DataError(f"data.source={self.source!r} and data.sources both say where the data is: a mixture's "
                            f"sources all go in data.sources; remove data.source, or set data.source={MIXTURE}")
        for entry in self.sources:
            fields = entry if isinstance(entry, dict) else {"source": entry}
            unknown = set(fields) - set(MIXTURE_FIELDS)
            if not isinstance(fields.get("source"), str) or unknown:
                raise DataError(f"data.sources entry {entry!r}: each is a source (text) or a mapping with "
                                f"{', '.join(MIXTURE_FIELDS)} (source required)")
            weight = fields.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
                raise DataError(f"data.sources entry {fields['source']!r}: weight={weight!r} must be a positive "
                                "number (1: each conversation once an epoch, 2: twice, 0.5: a random half)")
            DataConfig(**self.part_fields(fields))  # (each part checks its own settings)
        self.source = MIXTURE

    def part_fields(self, fields: dict) -> dict:
        shared = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("source", "sources", "hf_split",
                                                                               "hf_val_split", "hf_data_files")}
        return shared | {k: v for k, v in fields.items() if k != "weight"}

    def held_out_split(self, splits: list[str]) -> str | None:
        """The split of an hf: dataset (whose splits are `splits`) to validate on, by
        data.hf_val_split; None: a cut of data.val_fraction of data.hf_split."""
        if self.hf_val_split == "none":
            return None
        if self.hf_val_split != "auto":
            if self.hf_val_split not in splits and splits:
                raise DataError(f"data.hf_val_split={self.hf_val_split!r}: {self.source} has no such split (it has "
                                f"{', '.join(splits)}); name one of them, or auto, or none")
            if self.hf_val_split == self.hf_split:
                raise DataError(f"data.hf_val_split={self.hf_val_split!r} is the split the run trains on "
                                "(data.hf_split); validate on another, or on a cut of it: none")
            return self.hf_val_split
        if self.hf_split != "train":
            return None
        return next((split for split in ("validation", "test") if split in splits), None)

    def parts(self) -> list[tuple["DataConfig", float]]:
        """The mixture's sources, each as a DataConfig of its own, with its weight."""
        entries = [entry if isinstance(entry, dict) else {"source": entry} for entry in self.sources or []]
        return [(DataConfig(**self.part_fields(entry)), float(entry.get("weight", 1.0))) for entry in entries]


MIXTURE = "mixture"  # data.source of a run on data.sources
MIXTURE_FIELDS = ("source", "weight", "hf_split", "hf_val_split", "hf_data_files")
