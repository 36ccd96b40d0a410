"""Conversions between nnforge, numpy and PyTorch."""
