"""Models in and out: transformers' formats both ways (hf.py: GPT-2, GPT-NeoX, Llama, without
importing transformers) and GGUF for llama.cpp (gguf.py). export.py writes them, and
train.init_from reads transformers folders.

It sits beside jobs/ and inspection/: it may import runs/, the bottom floor (storage/, cli/, machine/),
model/ and data/, nothing above them.
"""
