"""A test pack that fails on import, after declaring a claim: neither may reach castcore's results."""

import torch

import castcore


@castcore.register_op_estimator(torch.ops.aten.relu.default)
def _relu(invoke, device):
    return 99.0  # would show up in results if a half-imported pack were ever used


import castpack_broken_import_missing_dependency  # noqa: E402,F401  (no such module: the import fails here)
