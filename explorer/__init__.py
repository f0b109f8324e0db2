"""The explorer: one HTML page that follows one token of a prompt through a trained model
(embedding, norms, q/k/v, the five steps of attention, W_O, residuals, the feed-forward
network, the logits), with the model's own numbers, in English or Chinese.

data.py turns a model and a prompt into the page's data through the model's own forward
pass (model.trace); page.py puts that data, and the files in page/ (template, scripts,
styles, strings), into one self-contained HTML file, which carries a small model's weights
and runs it on any text typed into it (page/model.js); server.py serves the same page on
127.0.0.1 for larger models; notebook.py shows it in a notebook cell (explorer.show).
explore.py is the command.
"""

from .notebook import show

__all__ = ["show"]
