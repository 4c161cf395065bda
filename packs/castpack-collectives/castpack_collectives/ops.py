"""The ``collectives`` op namespace: mark a collective explicitly in code that has no process group.

``torch.ops.collectives.all_reduce(x, group_size)`` and friends are torch.library custom ops with
fake implementations, so a capture records each as one opaque op that this pack times like the
matching ``_c10d_functional`` op. They never communicate. Run eagerly, each returns what the
collective would return if every rank of the group held ``x`` (all_reduce sums: ``x * group_size``),
so shapes and dtypes are right wherever the code runs.

Schemas (``dim`` is where all_gather concatenates and reduce_scatter splits)::

    collectives::all_reduce(Tensor x, int group_size) -> Tensor
    collectives::all_gather(Tensor x, int group_size, int dim=0) -> Tensor
    collectives::reduce_scatter(Tensor x, int group_size, int dim=0) -> Tensor
    collectives::all_to_all(Tensor x, int group_size) -> Tensor
    collectives::broadcast(Tensor x, int group_size) -> Tensor
"""

from __future__ import annotations

import torch

NAMESPACE = "collectives"


def _check(x: torch.Tensor, group_size: int, split_dim: int | None = None) -> None:
    torch._check(group_size >= 1, lambda: f"group_size must be >= 1, not {group_size}")
    if split_dim is not None:
        torch._check(x.shape[split_dim] % group_size == 0,
                     lambda: f"reduce_scatter: dim {split_dim} of size {x.shape[split_dim]} does not divide "
                             f"by {group_size}")


@torch.library.custom_op(f"{NAMESPACE}::all_reduce", mutates_args=())
def all_reduce(x: torch.Tensor, group_size: int) -> torch.Tensor:
    _check(x, group_size)
    return x * group_size



@torch.library.custom_op(f"{NAMESPACE}::all_gather", mutates_args=())
def all_gather(x: torch.Tensor, group_size: int, dim: int = 0) -> torch.Tensor:
    _check(x, group_size)
    return torch.cat([x] * group_size, dim=dim)


@all_gather.register_fake
def _(x, group_size, dim=0):
    _check(x, group_size)
    shape = list(x.shape)
    shape[dim] *= group_size
    return x.new_empty(shape)


@torch.library.custom_op(f"{NAMESPACE}::reduce_scatter", mutates_args=())
def reduce_scatter(x: torch.Tensor, group_size: int, dim: int = 0) -> torch.Tensor:
    _check(x, group_size, dim)
    return x.narrow(dim, 0, x.shape[dim] // group_size) * group_size


@reduce_scatter.register_fake
def _(x, group_size, dim=0):
    _check(x, group_size, dim)
    shape = list(x.shape)
    shape[dim] //= group_size
    return x.new_empty(shape)


@torch.library.custom_op(f"{NAMESPACE}::all_to_all", mutates_args=())
def all_to_all(x: torch.Tensor, group_size: int) -> torch.Tensor:
    _check(x, group_size)
    return x.clone()



@torch.library.custom_op(f"{NAMESPACE}::broadcast", mutates_args=())
def broadcast(x: torch.Tensor, group_size: int) -> torch.Tensor:
    _check(x, group_size)
    return x.clone()


def _same_shape(x, group_size):
    """The fake of every collective whose output has its input's shape."""
    _check(x, group_size)
    return torch.empty_like(x)


for _op in (all_reduce, all_to_all, broadcast):
    _op.register_fake(_same_shape)
