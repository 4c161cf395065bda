"""Quantized weights, activations and KV caches, as flags ask or checkpoints ship them."""
