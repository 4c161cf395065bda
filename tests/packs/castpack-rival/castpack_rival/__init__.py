"""A test pack: claims aten.mm like castpack-throwaway (a conflict) and cumsum declaring override."""

import torch

import castcore


@castcore.register_op_estimator(torch.ops.aten.mm.default)
def rival_mm(invoke, device):
    return 3.0


@castcore.register_op_properties(torch.ops.aten.cumsum.default, override=True)
def rival_cumsum(invoke, device):
    return invoke.memory_access_properties()


@castcore.register_op_estimator(torch.ops.aten.relu.default, device="throwaway-*")
def rival_relu_on_throwaway_only(invoke, device):
    return 4.0
