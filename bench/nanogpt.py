"""nanoGPT's checkpoints as run folders of this project, so that evaluate.py scores both
projects' models by one rule (bench/gpu_race.py).

nanoGPT's model is GPT-2's, written with nn.Linear like ours: the parameter names and
shapes are the same, so its weights load as they are. A checkpoint is read with
torch.load(weights_only=True) (tensors and plain values; nothing is executed), and its
character vocabulary is made again from the text, as nanoGPT's prepare.py makes it
(sorted(set(text))), rather than read from its pickled meta.pkl.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from runs.folder import RunDir
from model import GPT, GPTConfig

COMPILED_PREFIX = "_orig_mod."  # what torch.compile's wrapper puts before every name


def read_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def char_tokenizer(text: str) -> Tokenizer:
    """nanoGPT's character vocabulary, ids unchanged, as a tokenizers.Tokenizer. Unlike
    ours (data/tokenizer.py) it has no <unk>: an extra row would add its logit to every
    softmax and change the loss that is being compared."""
    vocab = {ch: i for i, ch in enumerate(sorted(set(text)))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return tokenizer


def to_run_folder(checkpoint: dict, text: str, out_dir: Path) -> Path:
    """Write config.json, model.safetensors and tokenizer.json of a nanoGPT checkpoint
    (trained on `text`) into out_dir; evaluate.py --checkpoint out_dir scores it."""
    args = checkpoint["model_args"]
    tokenizer = char_tokenizer(text)
    if tokenizer.get_vocab_size() != args["vocab_size"]:
        raise ValueError(f"the checkpoint's vocabulary has {args['vocab_size']} characters, the text "
                         f"{tokenizer.get_vocab_size()}: it was trained on another text")
    config = GPTConfig(vocab_size=args["vocab_size"], block_size=args["block_size"], n_layer=args["n_layer"],
                       n_head=args["n_head"], n_embd=args["n_embd"], bias=args["bias"],
                       pos_encoding="learned", activation="gelu")  # nanoGPT's nn.GELU() is the exact one
    model = GPT(config)
    state = {name.removeprefix(COMPILED_PREFIX): t for name, t in checkpoint["model"].items()}
    model.load_state_dict(state)  # strict: a name or a shape that differs stops here
    RunDir(out_dir).save_model(model, tokenizer)
    return out_dir
