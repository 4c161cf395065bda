"""Fake stand-ins for what a capture is given: a module's weights, each made on first use, and its inputs.

Fakes are CPU tensors made under the capture's fake mode, with the real tensor's shape, stride and dtype, so
no weight is ever allocated.
"""

from __future__ import annotations

from typing import Any

import torch

from castcore.recording.dtensor import dtensor_type, local_shards


class FakeWeights:
    """Fake stand-ins for a module's parameters and buffers, each made on first use.

    Tied tensors share one fake, as they share one storage. A weight of a layer that layer reuse
    replays is never touched by an op, so it only needs a storage id (``storage``); its fake is
    made, under that id, only if the layer has to run after all (``fake``)."""

    def __init__(self, recorder):  # the capture's recorder, which numbers storages
        self.recorder = recorder
        self._fakes: dict[int, torch.Tensor] = {}  # id(tensor) -> its fake
        self._unbacked: dict[int, tuple[int, int]] = {}  # id(tensor) -> (storage id, bytes), no fake yet

    def fake(self, t: torch.Tensor) -> torch.Tensor:
        fake = self._fakes.get(id(t))
        if fake is None:
            fake = self._fakes[id(t)] = _fake_like(t)
            if id(t) in self._unbacked:
                self.recorder.bind(local_shards(fake), self._unbacked.pop(id(t))[0])
        return fake

    def storage(self, t: torch.Tensor) -> int:
        if id(t) in self._fakes:
            return self.recorder.storage_of(local_shards(self._fakes[id(t)]))
        if id(t) not in self._unbacked:
            self._unbacked[id(t)] = (self.recorder.new_storage_id(), _dense_nbytes(local_shards(t)))
        return self._unbacked[id(t)][0]

    def storages(self) -> dict[int, int]:
        """Storage id -> bytes for every weight, with or without a fake."""
        held = self.recorder.storages(list(self._fakes.values()))
        held.update(self._unbacked.values())
        return held


def _dense_nbytes(t: torch.Tensor) -> int:
    """The bytes of the storage ``_fake_like(t)`` would allocate: just enough for t's shape and stride."""
    if t.numel() == 0:
        return 0
    return (1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))) * t.element_size()


def _fake_like(t: torch.Tensor) -> torch.Tensor:
    """A fake CPU tensor with t's shape, stride and dtype; must run under the fake mode.

    A DTensor (a tensor-parallel weight) stays a DTensor with the same mesh and placements over
    a fake copy of its local shard, so only the shard is ever counted as held on the device."""
    dtensor = dtensor_type()
    if dtensor is not None and isinstance(t, dtensor):
        local = _fake_like(t._local_tensor)
        return dtensor.from_local(
            local, t.device_mesh, t.placements, run_check=False, shape=t.shape, stride=t.stride()
        )
    return torch.empty_strided(
        t.shape, t.stride(), dtype=t.dtype, device="cpu", requires_grad=t.requires_grad
    )


def fake_inputs(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _fake_like(value)
    if isinstance(value, (list, tuple)):
        return type(value)(fake_inputs(v) for v in value)
    if isinstance(value, dict):
        return {k: fake_inputs(v) for k, v in value.items()}
    return value
