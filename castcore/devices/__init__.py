"""Devices: profiles with sourced numbers, the costs an op has on one, and the roofline that prices them.

Nothing here imports torch at import time, so ``castcore devices`` stays fast.
"""
