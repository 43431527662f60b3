"""rlparity: runs the bitwise suite over a matrix of cells and gates on the outcome."""

__version__ = "0.1.0"
