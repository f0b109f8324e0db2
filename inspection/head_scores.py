"""Three scores per attention head, read off the weights the model's own forward pass hands
back (model.trace), so a learner can watch heads take on a job while the model trains.

current-token score: on real text, the mean weight a query gives itself. 1: the head always
    looks at its own token (it passes that token on, e.g. to the queries of a later head).
previous-token score: on real text, the mean weight a query gives the token just before
    it (query 0 has none and is left out). 1: the head always looks one token back.
induction score: on the induction probe, n random tokens repeated once (2n tokens), the
    mean over the second copy's queries of the weight each gives the keys that follow an
    earlier occurrence of its own token: where an induction head looks (it finds the token
    it is reading earlier in the text and copies what came next; Olsson et al., 2022, "In-
    context Learning and Induction Heads"). 1: the head does nothing else.

The probe draws its n tokens without replacement where the tokenizer has n or more to draw
from, so that each token occurs once in each copy and the only key an induction head can
want is the one after the same token in the first copy (query t ≥ n: key t - n + 1). With
fewer tokens (a char model of 27 letters, say) some token recurs, and the score counts every
key after any earlier occurrence: a perfect head still scores 1, where counting the one
key t - n + 1 alone would cap it near 0.54 at 32 tokens and 0.32 at 64. The tokens are
drawn from those a model meets inside a line of text: none that holds a newline (where
text, and what a model has learnt to copy, often starts afresh), no special token and none
the model never generates.

A head that spreads its weight evenly over the keys it may see scores `uniform_scores`:
where every head starts, the line a chart of the scores is read against.
"""

from __future__ import annotations

import torch

from data.tokenizer import end_of_text_ids, suppressed_ids
from model import GPT, evaluating

PROBE_TOKENS = 64  # n, at most (and at most half the context)
KINDS = ("current_token", "previous_token", "induction")  # the scores, in the order the page and TensorBoard show them


def current_token_scores(weights: torch.Tensor) -> torch.Tensor:
    """weights [..., T, T] (a query's row sums to 1) -> [...]: the mean of weights[t, t] over t."""
    return weights.diagonal(dim1=-2, dim2=-1).mean(-1)


def previous_token_scores(weights: torch.Tensor) -> torch.Tensor:
    """weights [..., T, T] (a query's row sums to 1) -> [...]: the mean of weights[t, t - 1] over t ≥ 1."""
    return weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(-1)


def induction_targets(probe: torch.Tensor) -> torch.Tensor:
    """probe [2n] -> [n, 2n] booleans: for each query t of the second copy, the keys j ≤ t
    whose previous token is the query's token (probe[j - 1] == probe[t])."""
    n = probe.size(0) // 2
    queries = torch.arange(n, 2 * n)
    follows = torch.zeros(n, 2 * n, dtype=torch.bool)
    follows[:, 1:] = probe[None, :-1] == probe[n:, None]  # key j follows a copy of query t's token
    return follows & (torch.arange(2 * n)[None, :] <= queries[:, None])


def induction_scores(weights: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """weights [..., 2n, 2n] on `probe` [2n] -> [...]: the mean over the second copy's
    queries of the weight on their induction targets."""
    n = probe.size(0) // 2
    targets = induction_targets(probe.cpu()).to(weights.device, weights.dtype)  # [n, 2n]
    return (weights[..., n:, :] * targets).sum(-1).mean(-1)


def uniform_scores(length: int, probe: torch.Tensor) -> dict[str, float]:
    """What a head that weighs the keys it may see evenly scores: on a text of `length`
    tokens (previous token) and on `probe` (induction)."""
    even = torch.tril(torch.ones(max(length, probe.size(0)), max(length, probe.size(0))))
    even = even / even.sum(-1, keepdim=True)
    return {"current_token": current_token_scores(even[:length, :length]).item(),
            "previous_token": previous_token_scores(even[:length, :length]).item(),
            "induction": induction_scores(even[:probe.size(0), :probe.size(0)], probe).item()}


def induction_probe(tokenizer, vocab_size: int, block_size: int, seed: int = 0) -> torch.Tensor:
    """[1, 2n]: n = min(block_size // 2, PROBE_TOKENS) random tokens of the tokenizer's
    (none holding a newline nor special: see above), without replacement where there are
    n to draw from, then the same n again."""
    never = {*suppressed_ids(tokenizer), *end_of_text_ids(tokenizer)}
    never |= {i for i in range(vocab_size) if "\n" in tokenizer.decode([i]) or tokenizer.id_to_token(i) is None}
    never |= {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    allowed = torch.tensor(sorted(set(range(vocab_size)) - never))
    n = min(block_size // 2, PROBE_TOKENS)
    generator = torch.Generator().manual_seed(seed)
    if len(allowed) >= n:
        first = allowed[torch.randperm(len(allowed), generator=generator)[:n]]
    else:
        first = allowed[torch.randint(len(allowed), (n,), generator=generator)]
    return torch.cat([first, first])[None]


@torch.no_grad()
def head_scores(model: GPT, text: torch.Tensor, probe: torch.Tensor) -> dict[str, torch.Tensor]:
    """{"current_token" and "previous_token": [n_layer, H] on `text` [1, T], "induction":
    [n_layer, H] on `probe` [1, 2n]}, from the model's own attention weights in eval mode
    (and the text's maps, "maps": [n_layer, H, T, T], which TensorBoard draws)."""
    with evaluating(model):
        maps = model.trace(text).weights[:, 0].float()  # [n_layer, H, T, T]
        on_probe = model.trace(probe).weights[:, 0].float()  # [n_layer, H, 2n, 2n]
    return {"current_token": current_token_scores(maps).cpu(), "previous_token": previous_token_scores(maps).cpu(),
            "induction": induction_scores(on_probe, probe[0]).cpu(), "maps": maps.cpu()}
