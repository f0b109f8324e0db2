"""The explorer: one HTML page that follows one token of a prompt through a trained model
(embedding, norms, q/k/v, the five steps of attention, W_O, residuals, the feed-forward
network, the logits), with the model's own numbers, in English or Chinese.

data.py turns a model and a prompt into the page's data through the model's own forward
pass (model.trace); page.py puts that data, and the files in page/ (template,
script, styles, strings), into one self-contained HTML file; server.py serves the same
page on 127.0.0.1 for prompts typed in the browser. explore.py is the command.
"""
