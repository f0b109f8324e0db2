"""What a piece of the residual stream carries, read off with a linear probe (Alain & Bengio,
2016, "Understanding intermediate layers using linear classifier probes").

A piece is what one component wrote into the stream at each position (the embedding, a
head through its columns of W_O, a feed-forward network: inspection/circuits.py's
stream_pieces). Whether it carries the token at its own position, or the one before it, is
measured by fitting a linear map from the piece's vectors to the tokens (least squares onto
one-hot targets, with a little ridge) on half the positions and counting how often its
largest output names the right token on the other half: 1 where the piece spells the token
out, chance (1 / the tokens seen) where it carries nothing of it. In the induction circuit a
previous-token head writes the token before each position; whether layer 0's feed-forward
network writes it too is what `carried` answers for it.
"""

from __future__ import annotations

import torch

RIDGE = 1e-3  # the probe's ridge, a share of the features' mean square


def probe_accuracy(features: torch.Tensor, labels: torch.Tensor) -> float:
    """The held-out accuracy of a linear probe from features [N, C] to labels [N]: fitted on
    the even rows, scored on the odd ones."""
    x = torch.cat([features.double(), torch.ones(len(features), 1, dtype=torch.float64)], -1)  # with a bias
    classes, y = labels.unique(return_inverse=True)
    fit, held = slice(0, None, 2), slice(1, None, 2)
    onehot = torch.nn.functional.one_hot(y[fit], len(classes)).double()
    gram = x[fit].T @ x[fit]
    ridge = RIDGE * gram.diagonal().mean() * torch.eye(x.size(1), dtype=torch.float64)
    weights = torch.linalg.solve(gram + ridge, x[fit].T @ onehot)  # [C + 1, classes]
    return ((x[held] @ weights).argmax(-1) == y[held]).double().mean().item()


@torch.no_grad()
def carried(names: list[str], pieces: torch.Tensor, tokens: torch.Tensor) -> dict[str, dict[str, float]]:
    """For each piece (names, pieces [P, B, T, C] of passes over tokens [B, T]): how well a
    linear probe reads from it the token at its own position ("current") and the token one
    before ("previous", from position 1 on): {name: {"current", "previous"}}."""
    current = tokens[:, 1:].reshape(-1)
    previous = tokens[:, :-1].reshape(-1)
    found = {}
    for name, piece in zip(names, pieces):
        features = piece[:, 1:].reshape(-1, piece.size(-1)).float().cpu()
        found[name] = {"current": probe_accuracy(features, current.cpu()),
                       "previous": probe_accuracy(features, previous.cpu())}
    return found
