"""What every room of data/ shares, and nothing else: its one kind of error, and the mark
that ends a document in a stream of text pieces."""

from __future__ import annotations


class DataError(ValueError):
    """Bad data input: the message says what is wrong and how to fix it."""


# Document pieces: text chunks of one document, then END (documents can be large, so
# a .txt file arrives line by line).
END = None
Piece = str | None
