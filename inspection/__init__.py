"""Tools that show what the model computes, with its own numbers: the attention maps of
TensorBoard and generate.py --show-attention, the shape report of train.py --explain,
and the one table of words (English and Chinese) that they, the explorer and the docs'
figures name the model's pieces and the five steps of attention with."""
