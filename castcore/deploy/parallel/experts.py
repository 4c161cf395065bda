"""Expert parallelism (``--ep N``): a mixture-of-experts model's experts split across devices.

Each experts module (transformers 5 stores them as 3-D Parameters ``gate_up_proj`` [E, 2I, H] and ``down_proj``
[E, H, I], and calls it with (hidden_states, top_k_index, top_k_weights)) keeps E/ep experts on a device (its
parameters sliced along dim 0) and runs, on one device:

1. its share of the tokens: the tokens entering the MoE block are held by every rank of the tensor-parallel
   group (attention is tensor-parallel, its all_reduce leaves them replicated), so each rank routes 1/tp of them,
   as Megatron-LM's all-to-all token dispatcher does with sequence-parallel tokens; rank 0 takes the larger
   share when they do not divide;
2. dispatch: the routed copies (tokens x top_k) sorted by expert and sent with one all_to_all over the
   expert-parallel group (recorded as a low-latency all-to-all under ``--ep-kernels``, castcore.recording.hints).
   A device receives the rows of the busiest rank: of the group's tokens x top_k routed rows, the expected most
   any rank gets (castcore.recording.routing.busiest_rows: even routing still lands unevenly, and more so under
   ``--expert-skew``), split evenly across its local experts;
3. with ep < tp every expert is also split over tp/ep devices along its intermediate dimension: the received
   rows are all-gathered over those devices first and the partial outputs reduce-scattered after;
4. the grouped matmuls of its local experts (``aten::_grouped_mm``, the activation the module applies);
5. combine: an all_to_all back, the routing weights applied, each token's top_k outputs summed;
6. an all_gather over the tensor-parallel group, so every rank holds every token again.

With ep > tp the attention runs data-parallel over ep/tp groups of tp devices, each on batch/(ep/tp) sequences
(castcore.deploy.parallel.parallelize captures one group's batch). Shared experts (nn.Linear MLPs) stay tensor-parallel.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch

from castcore.hf.layers import is_experts_module
from castcore.options.catalog import say
from castcore.recording import routing
from castcore.recording.hints import collective_kernels
from castcore.deploy.parallel.tensor_plan import _expert_weights
from castcore.deploy.parallel.tensor_shards import _replace, split_experts
from castcore.workload.spec import ModelError


@dataclass(frozen=True)
class ExpertGroups:
    """The process groups one device's experts module talks over, and how many ranks share its tokens."""

    ep: Any  # the expert-parallel group: dispatch and combine all_to_all
    etp: Any  # the devices an expert is split over (ep < tp), or None
    tp: Any  # the ranks holding the same tokens (the tensor-parallel group), or None when tp == 1
    ep_size: int
    etp_size: int
    token_share: int  # ranks the block's tokens are replicated over: each routes 1/token_share of them
    kernels: str | None = None  # "low-latency": dispatch and combine as DeepEP's low-latency kernels run them


def experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    return [(path, m) for path, m in model.named_modules() if _expert_weights(m)]


def _splits(rows: int, n: int) -> list[int]:
    """``rows`` split as evenly as possible over ``n`` ranks."""
    return [rows // n + (i < rows % n) for i in range(n)]


def shard_experts(model: torch.nn.Module, groups: ExpertGroups) -> int:
    """Keep E/ep experts per experts module (split tp/ep ways more when ep < tp) and swap in the expert-parallel
    forward; the number of modules changed. ModelError when the model has none, or E does not divide by ep."""
    found = experts_modules(model)
    if not found:
        raise ModelError(
            f"{say('ep', groups.ep_size)}: {type(model).__name__} has no mixture-of-experts layers "
            "(no experts module with 3-D gate_up_proj/down_proj weights) to split; drop "
            f"{say('ep')}"
        )
    for path, experts in found:
        if not is_experts_module(experts):
            raise ModelError(
                f"{say('ep', groups.ep_size)}: {path} ({type(experts).__name__}) is not a transformers "
                f"experts module castcore can split; drop {say('ep')}"
            )
        for name in _expert_weights(experts):
            shape = tuple(getattr(experts, name).shape)
            if shape[0] % groups.ep_size:
                raise ModelError(
                    f"{say('ep', groups.ep_size)}: {path} has {shape[0]} experts, which do not divide "
                    f"by {groups.ep_size}; use an {say('ep')} that divides {shape[0]}"
                )
            _replace(experts, name, (shape[0] // groups.ep_size, *shape[1:]))
            bias = getattr(experts, f"{name}_bias", None)
            if isinstance(bias, torch.nn.Parameter):
                _replace(experts, f"{name}_bias", (bias.shape[0] // groups.ep_size, *bias.shape[1:]))
        if groups.etp_size > 1:
            split_experts(experts, path, groups.etp_size, option="tp")
        experts.num_experts = getattr(experts, _expert_weights(experts)[0]).shape[0]
        experts.forward = types.MethodType(_expert_parallel_forward(groups), experts)
    return len(found)


def _grouped(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, transposed: bool) -> torch.Tensor:
    # As transformers' grouped_mm experts run it: [rows, in] x [experts, in, out] grouped by offsets.
    return torch._grouped_mm(x, weight if transposed else weight.transpose(-2, -1), offs=offsets)


def _busiest_rows(local_experts: int, ranks: int, tokens: float, top_k: int) -> int:
    """Rows the busiest of ``ranks`` expert-parallel ranks receives when the group routes ``tokens`` tokens in all
    (castcore.recording.routing.busiest_rows: uneven even when balanced, more under the capture's routing skew),
    whole rows: a batch of one token runs about 3 of its 8 rows on the busiest of 8 devices, not 8."""
    skew = routing.recorded().get("expert_skew") or 0.0
    return max(1, round(routing.busiest_rows(local_experts * ranks, ranks, tokens, top_k, skew)))


def _expert_parallel_forward(groups: ExpertGroups):
    import torch.distributed._functional_collectives as funcol

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        # the body stays here: quantize swaps _grouped
        with routing.expert_routing(top_k=top_k_index.shape[-1]):
            tokens, hidden = hidden_states.shape
            top_k = top_k_index.shape[-1]
            share = -(-tokens // groups.token_share)  # this rank's tokens (the larger share)
            if share < tokens:
                hidden_states, top_k_index, top_k_weights = (
                    t.narrow(0, 0, share) for t in (hidden_states, top_k_index, top_k_weights)
                )
            rows = share * top_k
            # Dispatch: the routed copies sorted by expert, then sent to the devices holding their experts.
            order = torch.sort(top_k_index.reshape(-1)).indices
            routed = hidden_states[order // top_k]
            # Llama 4: the router weight scales the input
            if getattr(self, "castcore_weights_on_input", False):
                routed = routed * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(routed.dtype)
                top_k_weights = torch.ones_like(top_k_weights)
            splits = _splits(rows, groups.ep_size)
            # The busiest rank sets the pace: under a routing skew it receives more than its even share.
            # the group's tokens: each of its ep ranks routes 1/token_share of its tensor-parallel group's
            group_tokens = tokens * groups.ep_size / groups.token_share
            busiest = _splits(
                _busiest_rows(self.num_experts, groups.ep_size, group_tokens, top_k), groups.ep_size
            )
            with collective_kernels(groups.kernels):
                received = funcol.all_to_all_single(routed, busiest, splits, groups.ep)
            if groups.etp_size > 1:
                received = funcol.all_gather_single(received, 0, groups.etp)
            # Balanced routing: the received rows split evenly across the local experts.
            local, count = self.num_experts, received.shape[0]
            offsets = torch.arange(1, local + 1, dtype=torch.int32, device=received.device) * (count // local)
            bias = getattr(self, "has_bias", False)
            # each row's expert, for the biases
            ids = torch.arange(count, device=received.device) * local // max(count, 1) if bias else None
            transposed = bool(getattr(self, "is_transposed", False))
            gate_up = self.gate_up_proj if getattr(self, "has_gate", True) else self.up_proj
            out = _grouped(received, gate_up, offsets, transposed)
            # the fused activation (castcore.deploy.kernels.moe), first bias in it
            if hasattr(self, "castcore_gate"):
                out = self.castcore_gate(out, offsets)
            else:
                if bias:
                    out.add_(
                        (self.gate_up_proj_bias if getattr(self, "has_gate", True) else self.up_proj_bias)[
                            ids
                        ]
                    )
                out = self._apply_gate(out) if getattr(self, "has_gate", True) else self.act_fn(out)
            out = _grouped(out, self.down_proj, offsets, transposed)
            if bias:
                out.add_(self.down_proj_bias[ids])
            if groups.etp_size > 1:
                out = funcol.reduce_scatter_single(out, "sum", 0, groups.etp)
            # Combine: back to the tokens' devices, weighted by the router and summed over each token's top_k.
            with collective_kernels(groups.kernels):
                back = funcol.all_to_all_single(out, splits, busiest, groups.ep)
            weighted = back * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(back.dtype)
            restore = torch.empty_like(order)
            restore[order] = torch.arange(rows, device=order.device)
            combined = weighted[restore].view(share, top_k, hidden).sum(dim=1).to(hidden_states.dtype)
            if groups.token_share > 1:
                combined = funcol.all_gather_single(combined, 0, groups.tp)
                if combined.shape[0] != tokens:
                    combined = combined.narrow(0, 0, tokens)
            return combined

    return forward
