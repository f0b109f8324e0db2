"""Two scores per attention head, read off the weights the model's own forward pass hands
back (model.trace), so a learner can watch heads take on a job while the model trains.

previous-token score: on real text, the mean weight a query gives the token just before
    it (query 0 has none and is left out). 1: the head always looks one token back.
induction score: on n random tokens repeated once (2n tokens), the mean weight each token
    of the second copy gives the token that followed its earlier occurrence: query t ≥ n
    looking at key t - n + 1. 1: the head copies what came next last time, the pattern of
    an induction head (Olsson et al., 2022, "In-context Learning and Induction Heads").
    The random tokens are drawn from those a model meets inside a line of text: none that
    holds a newline (where text, and what a model has learnt to copy, often starts afresh),
    no special token and none the model never generates.

A head that spreads its weight evenly over the k keys it may see scores the mean over the
queries of 1/k on both.
"""

from __future__ import annotations

import torch

from data.tokenizer import end_of_text_ids, suppressed_ids
from model import GPT, evaluating


def previous_token_scores(weights: torch.Tensor) -> torch.Tensor:
    """weights [..., T, T] (a query's row sums to 1) -> [...]: the mean of weights[t, t - 1] over t ≥ 1."""
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def induction_scores(weights: torch.Tensor) -> torch.Tensor:
    """weights [..., 2n, 2n] on n tokens repeated once -> [...]: the mean of weights[t, t - n + 1]
    over the second copy's queries t = n .. 2n - 1."""
    n = weights.size(-1) // 2
    return weights[..., n:, :].diagonal(offset=1, dim1=-2, dim2=-1).mean(-1)  # [t, t - n + 1] for t ≥ n


def repeated_tokens(vocab_size: int, n: int, never: tuple[int, ...] = (), seed: int = 0) -> torch.Tensor:
    """[1, 2n]: n random token ids (none of `never`), then the same n again."""
    allowed = torch.tensor(sorted(set(range(vocab_size)) - set(never)))
    first = allowed[torch.randint(len(allowed), (n,), generator=torch.Generator().manual_seed(seed))]
    return torch.cat([first, first])[None]


def copy_test(tokenizer, vocab_size: int, block_size: int) -> torch.Tensor:
    """The induction score's sequence for a model: min(block_size // 2, 64) random tokens of
    the tokenizer's, none holding a newline nor special (see above), repeated once."""
    never = {*suppressed_ids(tokenizer), *end_of_text_ids(tokenizer)}
    never |= {i for i in range(vocab_size) if "\n" in tokenizer.decode([i]) or tokenizer.id_to_token(i) is None}
    never |= {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    return repeated_tokens(vocab_size, min(block_size // 2, 64), tuple(never))


@torch.no_grad()
def head_scores(model: GPT, text: torch.Tensor, repeated: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"previous_token": [n_layer, H] on `text` [1, T], "induction": [n_layer, H] on `repeated`
    [1, 2n]}, from the model's own attention weights in eval mode (and the text's maps,
    "maps": [n_layer, H, T, T], which TensorBoard draws)."""
    with evaluating(model):
        maps = model.trace(text).weights[:, 0].float()  # [n_layer, H, T, T]
        copying = model.trace(repeated).weights[:, 0].float()  # [n_layer, H, 2n, 2n]
    return {"previous_token": previous_token_scores(maps).cpu(), "induction": induction_scores(copying).cpu(),
            "maps": maps.cpu()}
