"""What the command-line programs (train.py, generate.py, evaluate.py, export.py) share:
one-line errors and exit codes, devices and precision, the run directory, attention maps.

It sits between model/ and data/ below and the programs and training/ above: it may
import model and data, never training.
"""
