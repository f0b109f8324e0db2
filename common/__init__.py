"""What the command-line programs (train.py, generate.py, evaluate.py, export.py, explore.py)
share: one-line errors and exit codes, devices and precision, the run folder, typed prompts.

It sits above model/ and data/: it may import them, nothing above them.
"""
