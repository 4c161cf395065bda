"""Parallelism: tensor, sequence, expert and pipeline-stage splits, and the layout one device's capture is cut from."""
