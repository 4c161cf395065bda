"""How one device's capture is cut from a deployment: ``Layout``, and ``plan_layout(workload)`` that makes it.

castcore.deploy.parallel.parallelize applies it to the model; castcore.deploy.parallel.pipeline_stages and the serving figures read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from castcore.options.catalog import say
from castcore.workload.spec import ModelError, Workload

if TYPE_CHECKING:
    from castcore.deploy.parallel.tensor_plan import TensorParallel


@dataclass
class Layout:
    """How one device's capture was cut from the deployment."""

    tp: int = 1
    sp: bool = False  # sequence parallelism applied (a prefill under --sp)
    ep: int = 1
    pp: int = 1
    micro_batches: int = 1
    dp: int = 1
    batch: int = 1  # sequences the capture runs: one device's (micro-)batch
    kv_batch: int = 1  # sequences whose KV cache one device holds
    tensor: TensorParallel | None = None

    @property
    def devices(self) -> int:
        return max(self.tp, self.ep) * self.pp

    def describe(self) -> str:
        """``tp 2 x pp 2 = 4 devices x 2 replicas``: the parallel layout of one replica, and the replicas."""
        parts = [
            f"{name} {value}" + (" (sp)" if name == "tp" and self.sp else "")
            for name, value in (("tp", self.tp), ("ep", self.ep), ("pp", self.pp))
            if value > 1
        ]
        text = " x ".join(parts) + f" = {self.devices} devices" if parts else "1 device"
        return text + (f" x {self.dp} replicas" if self.dp > 1 else "")


def plan_layout(workload: Workload) -> Layout:
    """The batch one device's capture runs and the sequences whose KV cache it holds (see castcore.deploy.parallel.parallelize's
    docstring)."""
    tp, ep, pp, m = workload.tp, workload.ep, workload.pp, workload.micro_batches
    groups = ep // tp if ep > tp else 1  # attention data-parallel groups
    kv_batch = -(-workload.batch // groups)  # the busiest group's sequences: the step waits for it
    if workload.phase == "decode":
        local = -(-kv_batch // pp)
    else:
        if kv_batch % m:
            raise ModelError(
                f"{say('micro_batches', m)} with {say('ep', ep)} over {say('tp', tp)}: each of {groups} "
                f"attention groups runs {m} micro-batches of its {kv_batch} sequences, which must divide "
                f"by {m}: use such a {say('batch')}"
            )
        local = kv_batch // m
    sp = workload.sp and workload.phase == "prefill"
    return Layout(tp=tp, sp=sp, ep=ep, pp=pp, micro_batches=m, dp=workload.dp, batch=local, kv_batch=kv_batch)
