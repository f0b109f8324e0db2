"""Everything a run starts from, opened and checked once: `prepare_run` hands it to the
Trainer (train.py) or to the shape trace (--explain):

1. train.init_from's model, if any: a bad one is refused before anything is written;
2. out_dir claimed (made writable and locked, on the main process: train.py's `claim`);
3. the token files, encoded with init_from's tokenizer if there is one, and the model's
   config (from the run config and the tokenizer, or from init_from's model);
4. with --fresh, the resume point in out_dir forgotten (otherwise the Trainer goes on from
   it: training/resume.py).
"""

from __future__ import annotations

import dataclasses
import socket
import time
from dataclasses import dataclass
from typing import Callable

from cli.program import UserError
from machine.threads import adaptable, set_threads
from runs.folder import RunDir
from data.prepare import TokenFiles, content_digest, discard
from data.shared import DataError
from data.tokenizer import tokenizer_kind
from interop.base_model import BaseModel, open_base_model
from jobs import Job, job_for
from model import GPTConfig

from .config import RunConfig
from .distributed import Distributed
from .init_from import config_for


@dataclass
class PreparedRun:
    """What the Trainer trains: a new run, or the one in out_dir to resume."""

    config: RunConfig
    job: Job  # what kind of job the run is (jobs/): a text, conversations, ...
    data: TokenFiles  # the job's prepared corpus: its sampler, its evaluation rows, its figures
    model_config: GPTConfig
    base: BaseModel | None  # train.init_from's model: the weights a new run starts from
    identity: dict  # the model and data settings a resume must match
    grad_accum: int  # train.grad_accum (a resume with another process count may change it: resume.py)
    prompt: str | None = "\n"  # one to try the model with, that its tokenizer can encode (None: conversations')
    seconds: float = 0.0  # what preparing took (data preparation), counted in the run's time
    adapt_threads: bool = False  # the thread count is the default's to adapt (machine/threads.py)


def prepare_run(cfg: RunConfig, dist: Distributed | None = None, fresh: bool = False,
                claim: Callable[[], None] = lambda: None, use_out_dir: bool = True,
                clock: Callable[[], float] = time.perf_counter) -> PreparedRun:
    """The run of `cfg` for this process. fresh: start over in out_dir. use_out_dir=False: a
    run that never reads or changes out_dir (--explain). clock: what the preparation's time
    (counted in the run's) is measured by."""
    dist = dist if dist is not None else Distributed()
    started = clock()
    set_threads("train", cfg.train.threads or None)
    # (under a time budget the count follows the machine's load; a run of fixed length chooses once: machine/threads.py)
    adapt_threads = adaptable("train", cfg.train.threads or None)
    if cfg.lora.rank and not cfg.train.init_from:
        raise UserError(f"lora.rank={cfg.lora.rank}: adapters fine-tune a model brought in; set train.init_from "
                        "(a run folder or a transformers model), or lora.rank=0 to train every weight")
    base = open_base_model(cfg.train.init_from) if cfg.train.init_from else None
    if base is not None:
        config_for(base, cfg.model, cfg.model_keys)  # refuse a changed setting before anything is written
    claim()
    job = job_for(cfg.data)  # (resolved once, from what the source holds)
    data, model_config = load_data(cfg, job, dist, base)
    unused = {"cache_dir", *(("tokenizer", "vocab_size") if base is not None else ())}  # (a base brings its tokenizer)
    data_identity = {**{k: v for k, v in vars(cfg.data).items() if k not in unused}, "init_from": cfg.train.init_from}
    # (heads held off make another model: a resume keeps them; None for a run that holds none, as before them)
    identity = {"model": {**model_config.to_dict(), "heads_off": cfg.train.heads_off or None}, "data": data_identity}
    if cfg.lora.rank:  # (a run with adapters resumes only with the same ones)
        identity["lora"] = dataclasses.asdict(cfg.lora)
    cfg = as_used(cfg, data, dist.is_main)
    if fresh and use_out_dir and dist.is_main:
        RunDir(cfg.out_dir).start_over()
    dist.barrier()  # (no process looks for the resume point before it is gone)
    prompt = data.suggested_prompt(cfg.train.sample_prompt)
    return PreparedRun(cfg, job, data, model_config, base, identity, cfg.train.grad_accum, prompt,
                       clock() - started, adapt_threads)


def as_used(cfg: RunConfig, data: TokenFiles, say: bool) -> RunConfig:
    """The run config as the run uses it, so that config.yaml (and a model card made from
    it) records what was used, not what was ignored: LoRA's adapters train with AdamW
    whatever train.optimizer says (said once); a model brought in (train.init_from) brings its
    own tokenizer, whatever data.tokenizer and data.vocab_size say."""
    if cfg.lora.rank and cfg.train.optimizer != "adamw":
        if say:
            print(f"note: LoRA's adapters train with AdamW (Muon would orthogonalise their low-rank updates); "
                  f"train.optimizer={cfg.train.optimizer} is recorded as adamw")
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, optimizer="adamw"))
    if cfg.train.init_from:
        used = dataclasses.replace(cfg.data, tokenizer=tokenizer_kind(data.tokenizer), vocab_size=data.vocab_size)
        cfg = dataclasses.replace(cfg, data=used)
    return cfg


def load_data(cfg: RunConfig, job: Job, dist: Distributed, base: BaseModel | None) -> tuple[TokenFiles, GPTConfig]:
    """The token files and the model's settings: from the run config, or with
    train.init_from from the base model, whose tokenizer then encodes the data.
    The first process of each node tokenizes (or finds) the token files; the others then
    reuse them, and with several nodes every process checks that it holds rank 0's."""
    tokenizer = base.tokenizer() if base else None
    template = base.chat_template() if base else None  # (conversations only; None: data/template.py's default)
    data = job.prepare(tokenizer, template, progress=True) if dist.local_rank == 0 else None
    dist.barrier()
    if data is None:
        data = job.prepare(tokenizer, template, progress=False)
    if dist.nodes > 1:
        check_same_data(data, dist)
    added = data.vocab_size - tokenizer.get_vocab_size() if base else 0  # the default chat template's markers
    if base is None:
        model_config = cfg.model_with_vocab(data.vocab_size)
    elif data.vocab_size - added > base.config.vocab_size:
        raise UserError(f"train.init_from={base.name}: its tokenizer has {data.vocab_size - added} tokens, more "
                        f"than the model's {base.config.vocab_size}")
    else:
        model_config = config_for(base, cfg.model, cfg.model_keys)
        if data.vocab_size > model_config.vocab_size:  # the embedding grows (BaseModel.state_dict)
            if dist.is_main:
                print(f"note: {added} chat markers are added to {base.name}'s tokenizer, and "
                      f"{data.vocab_size - model_config.vocab_size} rows to its embedding, each the mean of the "
                      "others, for fine-tuning to teach")
            model_config = dataclasses.replace(model_config, vocab_size=data.vocab_size)
    if dist.is_main and (left_out := data.bad_records()):
        print(f"note: {left_out}")
    if dist.is_main and (lost := data.characters_lost()):
        print(f"note: {lost} (data.unencodable={cfg.data.unencodable:g})")
    try:  # (a text too short for one window of either split; conversations too long, refused)
        data.check_fits(model_config.block_size, cfg.data.chat_too_long, say=dist.is_main)
    except DataError:
        discard(data)  # token files no run with these settings can use are not kept in the cache
        raise
    return data, model_config


def check_same_data(data: TokenFiles, dist: Distributed) -> None:
    """Every node prepared its own token files (paths and times differ between nodes, so
    the hash is of their content and the tokenizer's): all must equal rank 0's."""
    held = dist.gather((socket.gethostname(), content_digest(data.directory)))
    for rank, (host, digest) in enumerate(held):
        if digest != held[0][1]:
            raise UserError(f"node {host} (rank {rank}) holds other token files than rank 0 on {held[0][0]} "
                            f"(their content differs, in {data.directory}): give every node the same corpus "
                            "and data settings, or put data.cache_dir on storage all nodes share")
