"""A model factory for `--model tests.factories.tiny_mlp:make` tests: a plain nn.Module and its inputs."""

import torch


def make(batch: int = 1, dtype: torch.dtype = torch.float32):
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(dtype)
    return model, (torch.empty(batch, 32, dtype=dtype, device="meta"),)


def not_a_model():
    return 42


@torch.library.custom_op("castcore_factories::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@mystery.register_fake
def _(x):
    return torch.empty_like(x)


class WithMystery(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        return mystery(self.linear(x))


def with_custom_op():
    """A model whose custom op nobody claims: it falls back to the memory-only estimate."""
    return WithMystery(), (torch.empty(2, 16, device="meta"),)


def make_workload(batch: int = 1):
    """The same model, returned as a castcore Workload."""
    import castcore

    model, inputs = make(batch)
    return castcore.build_workload(model, *inputs)
