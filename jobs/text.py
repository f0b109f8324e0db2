"""A text: the job of the quick start and of every model trained from scratch on prose.
TextJob is the kind; what it does with the data (its token files, its corpus, its scores) is
jobs/text_data.py's, imported where it is used, so that a program that only prompts a model
(generate.py) loads no reader of files or datasets."""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer

from cli.program import UserError
from data.config import DataConfig
from runs.folder import RunDir

from .job import Job, Scoring


class TextJob(Job):
    """A text (data/text.py's sources: the built-in Shakespeare, the lesson's copies, files, hf: datasets)."""

    name = "text"

    def __init__(self, config: DataConfig | None = None):
        self.config = config  # (None: a job read back from a run folder, which prepares nothing)

    @classmethod
    def takes(cls, config: DataConfig) -> TextJob:
        """Any source is read as text that is not another kind's (jobs.KINDS asks this one last)."""
        return cls(config)

    @classmethod
    def of_run(cls, run: RunDir) -> TextJob:
        return cls()

    # ---- training --------------------------------------------------------------------------

    def prepare(self, tokenizer: Tokenizer | None = None, chat_template: str | None = None,
                progress: bool = True):
        from data.prepare import token_folder
        from data.text import open_source

        from .text_data import TextData, TextFormat

        directory, built = token_folder(self.config, TextFormat(open_source(self.config)), tokenizer, progress)
        return TextData.read(directory, built)

    def save_beside(self, run: RunDir, data) -> None:
        """Nothing: a text's model needs nothing but itself and its tokenizer."""

    def try_it(self, out_dir: Path, prompt: str | None) -> str:
        return f"try it: python generate.py --checkpoint {out_dir} --prompt \"{prompt}\""

    # ---- the programs ------------------------------------------------------------------------

    def chat_session(self, model, tokenizer: Tokenizer, checkpoint: Path, **settings):
        raise UserError(f"{checkpoint} has no chat template: it was trained on plain text; chat needs a model "
                        "fine-tuned on conversations (docs/usage.md); give it a --prompt to continue instead")

    def card(self, out: Path, summary: dict) -> dict[str, str]:
        prompt = summary.get("prompt", "\n")  # one the run's tokenizer encodes
        bits = summary.get("val_bits_per_char")
        return {"example": f"from transformers import pipeline\nprint(pipeline(\"text-generation\", model="
                           f"{str(out)!r})({prompt!r}, max_new_tokens=100)[0][\"generated_text\"])",
                "unit": "nats per token" + (f", {bits:.3f} bits per character" if bits is not None else "")}

    def tokenizer_settings(self) -> dict[str, str]:
        return {}

    # ---- evaluate.py ----------------------------------------------------------------------------

    def check_options(self, scoring: Scoring) -> None:
        scoring.refuse_all_but("stride", kind="plain text")

    def evaluate(self, model, tokenizer: Tokenizer, scoring: Scoring) -> dict:
        """Every token of --text FILE or of the run's validation split scored once, in windows of
        block_size tokens moved by --stride (Hugging Face's perplexity guide): the loss in nats per
        token, the perplexity, bits per character and per UTF-8 byte (these two compare char and
        BPE models). Memory stays bounded however long the text."""
        from .text_data import score, scored_windows, text_chunks

        block = model.config.block_size
        stride = max(1, block // 2) if scoring.stride is None else scoring.stride
        if not 1 <= stride <= block:
            raise UserError(f"--stride={stride}: must be between 1 and block_size={block}")
        counts = {"characters": 0, "bytes": 0}
        # (a memory-mapped file that Windows may still hold open when the folder goes: ignore_cleanup_errors)
        with tempfile.TemporaryDirectory(prefix="evaluate-", ignore_cleanup_errors=True) as scratch:
            chunks = self.validation_chunks(scoring.checkpoint, tokenizer, counts, Path(scratch)) \
                if scoring.text is None else text_chunks(scoring.text, tokenizer, counts)
            nll, tokens = score(model, scored_windows(chunks, block, stride), scoring.batch_size, scoring.device,
                                scoring.threads)
            chunks.close()  # lets go of the tokens' file
        if tokens == 0:
            raise UserError(f"{scoring.text or 'the validation split'} is too short to score: it needs at least 2 "
                            "tokens")
        loss = nll / tokens
        return {"loss": loss, "perplexity": math.exp(min(loss, 50)),
                "bits_per_char": nll / math.log(2) / counts["characters"],
                "bits_per_byte": nll / math.log(2) / counts["bytes"], "tokens": tokens, **counts,
                "stride": stride, "block_size": block}

    def report(self, r: dict, what: str) -> tuple[dict, list[str]]:
        figures = {k: r[k] for k in ("loss", "perplexity", "bits_per_char", "bits_per_byte", "tokens", "characters",
                                     "bytes")}
        return figures, [
            f"{what}: {r['tokens']:,} tokens scored ({r['characters']:,} characters, {r['bytes']:,} bytes) in "
            f"{r['seconds']:.1f} s, {r['tokens'] / max(r['seconds'], 1e-9):,.0f} tokens/s; windows of "
            f"{r['block_size']} tokens moved by {r['stride']}",
            f"loss {r['loss']:.4f} nats/token | perplexity {r['perplexity']:.3f} | "
            f"{r['bits_per_char']:.4f} bits/char | {r['bits_per_byte']:.4f} bits/byte"]

    def validation_chunks(self, checkpoint: Path, tokenizer: Tokenizer, counts: dict,
                          scratch: Path):
        """The run's validation tokens: its own token files where they are still in the cache,
        else the validation text alone, encoded into `scratch`."""
        from .text_data import CHUNK, validation_tokens

        tokens, sizes, cached = validation_tokens(self.config, tokenizer, scratch)
        if not cached:
            print(f"encoded the validation text of {self.config.source} with the run's tokenizer "
                  "(the run's token files are not in the cache)", file=sys.stderr)
        counts.update(sizes)
        for start in range(0, len(tokens), CHUNK):
            yield tokens[start:start + CHUNK]  # (windows gathers them into int64)
