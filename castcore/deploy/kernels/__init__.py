"""Deployed kernels: the rewrites that make a model run as serving engines run it."""
