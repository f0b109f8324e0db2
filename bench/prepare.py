"""Preparing corpora of gigabytes: the process's own memory, and the speed of ours against
the Hugging Face way, side by side.

The corpus is generated (nothing is downloaded): a folder of .txt files (one document
each) and a .jsonl file (one document a row), half the size each, of made-up words whose
vocabulary keeps growing with the text, so that a BPE trainer keeps meeting new words.
For each source and tokenizer:

1. ours from scratch, tokenizer training included: `data.prepare` in its own process;
2. ours again with that tokenizer given, and
3. the Hugging Face way with the same tokenizer: `datasets.load_dataset(...)` then
   `.map(batched=True, num_proc=2)` (tokenizer.encode_batch), the same documents, split
   (the last 10% of the characters) and separators, written to the same flat token files.

2 and 3 must write identical token files. Then Parquet rows read as an hf: dataset (a
local folder in the hub's layout) at two sizes, with Arrow's pre-buffering off (ours) and
on (Arrow's default, which reads each whole file into memory: apache/arrow#39808): what
ours costs must not grow with the rows. Memory is the peak of the process's own memory,
sampled every 0.25 s: RssAnon (anonymous resident memory: heap and arrays, not the
file-backed page cache the corpus passes through), and for a process with children (the
Hugging Face way's num_proc=2) the sum of their Pss_Anon (shared pages counted once); disk is what each left in its
datasets cache (a temporary folder, removed after). Linux only (it reads /proc).

    python -m bench.prepare [--megabytes 1024] [--tokenizers char bpe] [--parquet 16 320] [--quick] [--out JSON]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent  # (bench.common imports torch: the Hugging Face way must not)

SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]


def spellings(count: int) -> np.ndarray:
    """Word number i spelled in syllables (its digits in base 90): all different."""
    words = []
    for i in range(count):
        word = SYLLABLES[i % 90]
        while i >= 90:
            i //= 90
            word += SYLLABLES[i % 90]
        words.append(word)
    return np.array(words, dtype=object)


def made_up_text(rng: np.random.Generator, spelled: np.ndarray, words_before: int, size: int) -> str:
    """About `size` characters of lines of 12 words. The vocabulary in use grows like
    the square root of the words written so far (Heaps' law), the common words most used."""
    n = size // 6
    vocabulary = min(len(spelled), 2_000 + int(40 * (words_before + n) ** 0.5))
    ids = (vocabulary * rng.random(n) ** 4).astype(np.int64)
    lines = spelled[ids[: n - n % 12]].reshape(-1, 12)
    return "\n".join(" ".join(line) for line in lines) + "\n"


def write_corpus(folder: Path, megabytes: float, seed: int = 0) -> dict[str, Path]:
    """A folder of .txt files and a .jsonl file, megabytes / 2 each."""
    rng = np.random.default_rng(seed)
    half = int(megabytes * 2**20 / 2)
    spelled = spellings(2_000 + int(40 * (megabytes * 2**20 / 5.5) ** 0.5))
    (folder / "txt").mkdir(parents=True)
    written = words = part = 0
    while written < half:
        text = made_up_text(rng, spelled, words, min(8 << 20, half - written + 64))
        (folder / "txt" / f"part-{part:04d}.txt").write_text(text, encoding="utf-8")
        written, words, part = written + len(text), words + len(text) // 6, part + 1
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as f:
        written = 0
        while written < half:
            text = made_up_text(rng, spelled, words, 4_000)
            f.write(json.dumps({"text": text}) + "\n")
            written, words = written + len(text), words + len(text) // 6
    return {"txt folder": folder / "txt", "jsonl file": folder / "corpus.jsonl"}


def own_memory_kb(pid: int) -> int:
    """A process's own memory with its descendants', in kB (0 once gone): RssAnon for the
    process, and for a tree the sum of Pss_Anon, which splits the anonymous pages forked
    children still share with their parent between them instead of counting them twice."""
    try:
        field, path = ("RssAnon:", "status") if not children_of(pid) else ("Pss_Anon:", "smaps_rollup")
        return sum(anonymous(p, field, path) for p in [pid, *descendants(pid)])
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return 0


def anonymous(pid: int, field: str, name: str) -> int:
    line = next((line for line in Path(f"/proc/{pid}/{name}").read_text().splitlines() if line.startswith(field)), None)
    return int(line.split()[1]) if line else 0  # (a process on its way out)


def children_of(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


def descendants(pid: int) -> list[int]:
    return [d for child in children_of(pid) for d in (child, *descendants(child))]


def measured(code: str, env: dict, args: tuple[str, ...] = ()) -> dict:
    """Run `python -c code` (or python ARGS) and watch it: wall seconds and peak own memory."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, *(args or ("-c", code))], cwd=ROOT, env={**os.environ, **env},
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    peak = 0
    while process.poll() is None:  # (reading smaps_rollup costs the kernel a walk of the memory map: not too often)
        peak = max(peak, own_memory_kb(process.pid))
        time.sleep(0.25)
    if process.returncode != 0:
        raise SystemExit(f"failed:\n{code}\n{process.stderr.read()[-3000:]}")
    return {"seconds": time.perf_counter() - start, "peak_own_mb": peak / 1024}


def folder_mb(path: Path) -> float:
    return 0.0 if not path.exists() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


OURS = """
from data.config import DataConfig
from jobs import prepare
from data.tokenizer import load_tokenizer
given = {given!r}
prepare(DataConfig(source={source!r}, tokenizer={kind!r}, vocab_size={vocab}, cache_dir={cache!r}),
        progress=False, tokenizer=load_tokenizer(given) if given else None)
"""

PRE_BUFFERED = """
import pyarrow.dataset
arrows_own = pyarrow.dataset.ParquetFragmentScanOptions
pyarrow.dataset.ParquetFragmentScanOptions = lambda pre_buffer=False: arrows_own(pre_buffer=True)
"""  # (put before OURS: Arrow's default, which data/readers.py's load_split turns off)


def parquet_memory(tmp: Path, sizes: list[float]) -> list[dict]:
    """Own memory preparing `sizes` MB of Parquet rows (4 MB of the .jsonl corpus's rows
    repeated, in row groups of 500) as an hf: dataset, ours and with pre-buffering on: each
    from empty caches, the lower of two readings (a busy machine adds tens of MB to one)."""
    import pyarrow
    import pyarrow.json
    import pyarrow.parquet

    rows = pyarrow.json.read_json(write_corpus(tmp / "parquet-rows", 8)["jsonl file"])
    results = []
    for megabytes in sizes:
        folder = tmp / f"parquet-{megabytes:g}"
        folder.mkdir()
        pyarrow.parquet.write_table(pyarrow.concat_tables([rows] * max(1, round(megabytes / 4))),
                                    folder / "train.parquet", row_group_size=500)
        result = {"megabytes": megabytes}
        for way, prelude in (("ours", ""), ("pre-buffered", PRE_BUFFERED)):
            readings = []
            for attempt in range(2):
                caches = tmp / f"caches-{megabytes:g}-{way}-{attempt}"
                code = prelude + OURS.format(given=None, source=f"hf:{folder}", kind="char", vocab=0,
                                             cache=str(caches / "tokens"))
                readings.append(measured(code, {"HF_DATASETS_CACHE": str(caches / "hf"), "HF_HUB_OFFLINE": "1"}))
                shutil.rmtree(caches, ignore_errors=True)
            result[way] = min(readings, key=lambda r: r["peak_own_mb"])
        results.append(result)
    return results


HUGGING_FACE = """
from bench.prepare import hugging_face_way
hugging_face_way({source!r}, {tokenizer!r}, {out!r}, {cache!r})
"""


def hugging_face_way(source: str, tokenizer_file: str, out: str, cache: str, val_fraction: float = 0.1) -> None:
    """What a datasets user writes: load, map the tokenizer over batches in 2 processes,
    then write the ids of each split to a flat file, documents separated as ours are."""
    import datasets
    from tokenizers import Tokenizer

    from data.prepare import token_dtype  # (uint16, or uint32 past 65,536 tokens: the same files as ours)

    tokenizer = Tokenizer.from_file(tokenizer_file)
    path = Path(source)
    if path.is_dir():  # a document per file
        files = [str(f) for f in sorted(path.rglob("*.txt"))]
        ds = datasets.load_dataset("text", data_files=files, sample_by="document", split="train", cache_dir=cache)
    else:
        ds = datasets.load_dataset("json", data_files=source, split="train", cache_dir=cache)
    lengths = np.array(ds.map(lambda b: {"n": [len(t) for t in b["text"]]}, batched=True, num_proc=2,
                              remove_columns=ds.column_names)["n"])
    cut = int(lengths.sum() * (1 - val_fraction))  # the last 10% of the characters are validation
    train_chars = np.clip(cut - (np.cumsum(lengths) - lengths), 0, lengths)

    def encode(batch, indices):
        out = {}
        for split in ("train", "val"):
            parts = [text[:train_chars[i]] if split == "train" else text[train_chars[i]:]
                     for text, i in zip(batch["text"], indices)]
            out[f"{split}_ids"] = [e.ids for e in tokenizer.encode_batch(parts, add_special_tokens=False)]
            out[f"{split}_text_end"] = [p[-2:] for p in parts]
            out[f"{split}_empty"] = [not p for p in parts]
        return out

    # (a .txt file is one document of up to 8 MB: one a batch keeps the lists of ids it becomes within memory)
    rows = 1 if path.is_dir() else 1000
    ids, text, flag = datasets.Sequence(datasets.Value("int32")), datasets.Value("string"), datasets.Value("bool")
    columns = datasets.Features({f"{split}_{name}": kind for split in ("train", "val")
                                 for name, kind in (("ids", ids), ("text_end", text), ("empty", flag))})
    ds = ds.map(encode, batched=True, with_indices=True, num_proc=2, remove_columns=ds.column_names,
                batch_size=rows, writer_batch_size=rows, features=columns)
    eot = tokenizer.token_to_id("<|endoftext|>")
    dtype = token_dtype(tokenizer.get_vocab_size())
    for split in ("train", "val"):
        tail, first = "", True
        with open(Path(out) / f"{split}.bin", "wb") as f:
            for row in ds.select_columns([f"{split}_ids", f"{split}_text_end", f"{split}_empty"]).iter(1000):
                for ids, end, empty in zip(row[f"{split}_ids"], row[f"{split}_text_end"], row[f"{split}_empty"]):
                    if empty:
                        continue
                    if not first:  # between documents: <|endoftext|>, or enough newlines for a blank line
                        blank = "" if tail.endswith("\n\n") else "\n" if tail.endswith("\n") else "\n\n"
                        np.asarray([eot] if eot is not None else tokenizer.encode(blank).ids, dtype).tofile(f)
                    np.asarray(ids, dtype).tofile(f)
                    tail, first = (tail + end)[-2:], False


TRAINING = ["train.max_iters=30", "train.eval_interval=30"]  # (--quick: 3 iterations, 3 evaluation batches)
QUICK_TRAINING = ["train.max_iters=3", "train.eval_interval=3", "train.eval_iters=3"]


def training_memory(source: str, cache: str, out: str, length: list[str]) -> dict:
    """Peak own memory of training tiny.yaml (for `length`) on prepared token files (memory-mapped)."""
    return measured("", {}, ("train.py", "--config", "configs/tiny.yaml", f"data.source={source}",
                             f"data.cache_dir={cache}", f"out_dir={out}", *length, "train.max_minutes=null",
                             "train.sample_tokens=0", "--fresh"))


def compare(corpus: Path, source: str, kind: str, vocab: int, tmp: Path, length: list[str]) -> dict:
    """Ours from scratch, ours with the tokenizer given, the Hugging Face way; one source."""
    work = tmp / f"{Path(source).stem}-{kind}"
    work.mkdir()
    env = {"HF_DATASETS_CACHE": str(work / "hf-cache-ours"), "TOKENIZERS_PARALLELISM": "true"}
    scratch = measured(OURS.format(given=None, source=source, kind=kind, vocab=vocab, cache=str(work / "ours")), env)
    prepared = next((work / "ours").glob("*/meta.json")).parent
    tokenizer = str(prepared / "tokenizer.json")
    shutil.rmtree(work / "hf-cache-ours", ignore_errors=True)  # both start cold (ours reads .txt and .jsonl itself)
    given = measured(OURS.format(given=tokenizer, source=source, kind=kind, vocab=vocab,
                                 cache=str(work / "given")), env)
    ours_disk = folder_mb(work / "hf-cache-ours")
    (work / "hf").mkdir()
    theirs = measured(HUGGING_FACE.format(source=source, tokenizer=tokenizer, out=str(work / "hf"),
                                          cache=str(work / "hf-cache")), {})
    theirs_disk = folder_mb(work / "hf-cache")
    ours_dir = next((work / "given").glob("*/meta.json")).parent
    identical = all((ours_dir / f"{s}.bin").read_bytes() == (work / "hf" / f"{s}.bin").read_bytes()
                    for s in ("train", "val"))
    size = folder_mb(Path(source)) if Path(source).is_dir() else Path(source).stat().st_size / 2**20
    training = training_memory(source, str(work / "ours"), str(work / "run"), length) if kind == "char" else None
    shutil.rmtree(work)
    return {"source": source, "tokenizer": kind, "megabytes": size, "scratch": scratch, "ours": given,
            "ours_cache_mb": ours_disk, "hugging_face": theirs, "hugging_face_cache_mb": theirs_disk,
            "identical": identical, "training": training}


def main() -> None:
    from bench.common import machine, save, table

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=1024, help="corpus size in all (half .txt, half .jsonl)")
    parser.add_argument("--tokenizers", nargs="+", default=["char", "bpe"], choices=["char", "bpe"])
    parser.add_argument("--vocab-size", type=int, default=4096, help="for bpe")
    parser.add_argument("--parquet", nargs="+", type=float, default=[16, 320],
                        help="MB of Parquet rows whose own memory is compared")
    parser.add_argument("--quick", action="store_true", help="a 1 MB corpus, BPE only, 2 MB of Parquet rows "
                                                             "(a test runs this)")
    parser.add_argument("--out", help="JSON path (default bench/results/prepare.json)")
    args = parser.parse_args()
    megabytes = 1 if args.quick else args.megabytes
    tokenizers = ["bpe"] if args.quick else args.tokenizers  # (--quick: each step once; a test runs it)
    results, rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sources = write_corpus(tmp / "corpus", megabytes)
        length = QUICK_TRAINING if args.quick else TRAINING
        corpus = str(sources["txt folder"]) if args.quick else "shakespeare"  # (--quick: not the 4.8 MB built-in corpus)
        measured(OURS.format(given=None, source=corpus, kind="char", vocab=0, cache=str(tmp / "s")), {})
        shakespeare = training_memory(corpus, str(tmp / "s"), str(tmp / "s-run"), length)
        print(f"training on {corpus}: {shakespeare['peak_own_mb']:.0f} MB own memory", flush=True)
        for kind in tokenizers:
            for label, source in sources.items():
                r = compare(tmp / "corpus", str(source), kind, args.vocab_size, tmp, length)
                r["source"] = label
                results.append(r)
                rows.append([label, kind, r["megabytes"], r["scratch"]["seconds"], r["scratch"]["peak_own_mb"],
                             r["megabytes"] / r["ours"]["seconds"], r["megabytes"] / r["hugging_face"]["seconds"],
                             r["ours"]["peak_own_mb"], r["hugging_face"]["peak_own_mb"], r["ours_cache_mb"],
                             r["hugging_face_cache_mb"], "yes" if r["identical"] else "NO"])
                print(f"{label}, {kind}: ours {rows[-1][5]:.1f} MB/s, Hugging Face {rows[-1][6]:.1f} MB/s, "
                      f"identical: {rows[-1][-1]}", flush=True)
        parquet = parquet_memory(tmp, [2] if args.quick else args.parquet)
        path = save("prepare", {"machine": machine(os.cpu_count()), "results": results,
                                "training_on_shakespeare": shakespeare, "parquet": parquet}, args.out)
    print("\nPeak own memory: RssAnon (a tree of processes: the sum of Pss_Anon); MB/s with the tokenizer given\n")
    print(table(["source", "tokenizer", "MB", "from scratch (s)", "from scratch, own MB", "ours MB/s",
                 "HF map MB/s", "ours own MB", "HF own MB", "ours cache MB", "HF cache MB", "identical"], rows))
    for r in results:
        if r["training"]:
            print(f"training on the {r['source']} ({r['tokenizer']}): {r['training']['peak_own_mb']:.0f} MB own "
                  f"memory, {r['training']['peak_own_mb'] / shakespeare['peak_own_mb']:.2f}x Shakespeare's")
    print("\nParquet rows as an hf: dataset, peak own memory (MB)\n")
    print(table(["MB of rows", "ours", "pre-buffered (Arrow's default)"],
                [[r["megabytes"], r["ours"]["peak_own_mb"], r["pre-buffered"]["peak_own_mb"]] for r in parquet]))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
