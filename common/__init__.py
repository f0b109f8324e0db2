"""What the command-line programs (train.py, generate.py, evaluate.py, export.py) share:
one-line errors and exit codes, devices and precision, the run directory, transformers'
formats, typed prompts.

It sits between model/ and data/ below and inspection/, training/, explorer/ and the
programs above: it may import model and data, nothing above them.
"""
