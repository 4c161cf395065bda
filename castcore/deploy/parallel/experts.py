"""Expert parallelism (``--ep N``): a mixture-of-experts model's experts split across devices.

Each experts module (transformers 5 stores them as 3-D Parameters ``gate_up_proj`` [E, 2I, H] and ``down_proj``
[E, H, I], and calls it with (hidden_states, top_k_index, top_k_weights)) keeps E/ep experts on a device (its
parameters sliced along dim 0; with ep < tp each expert is also split over tp/ep devices along its intermediate
dimension). A device runs as many of the routed (token, expert) rows as the busiest device is expected to get
(castcore.recording.routing.busiest_rows: even routing still lands unevenly, and more so under
``--expert-skew``), split evenly across its local experts, through the grouped products
(``aten::_grouped_mm``) with the activation between them. How the rows reach it depends on who holds the tokens:

- ep <= tp: attention is tensor-parallel and its all_reduce leaves every token on every device of the group, so
  nothing is sent. Each device gathers the rows of its own experts (``castcore::moe_permute``), combines their
  weighted outputs per token (``castcore::moe_unpermute``), and one all_reduce over the group sums the devices'
  shares (with a shared expert's partial output in the same sum), as vLLM runs expert parallelism without data parallelism (its all-to-all kernels only run with
  ``--data-parallel-size`` > 1: ``FusedMoEParallelConfig.use_all2all_kernels`` in
  vllm/model_executor/layers/fused_moe/config.py) and TensorRT-LLM with tensor-parallel attention;
- ep > tp (attention data-parallel over ep/tp groups of tp devices, castcore.deploy.parallel.parallelize
  capturing one group's batch): a device's tokens are its own. Each of a group's tp ranks routes 1/tp of them
  (rank 0 the larger share), sorts the routed copies by expert (``castcore::moe_permute``) and sends them with one
  all_to_all over the expert-parallel group (recorded as a low-latency all-to-all under ``--ep-kernels``,
  castcore.recording.hints); the outputs come back with another, are weighted and summed per token
  (``castcore::moe_unpermute``) and all-gathered over the tp ranks.

Shared experts (nn.Linear MLPs) stay tensor-parallel.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from castcore.builtin import moe_ops  # noqa: F401  (defines castcore::moe_permute and moe_unpermute)
from castcore.hf.layers import is_experts_module
from castcore.options.catalog import say
from castcore.recording import routing
from castcore.recording.hints import collective_kernels
from castcore.deploy.parallel.tensor_plan import _expert_weights
from castcore.deploy.parallel.tensor_shards import _replace, split_experts
from castcore.workload.spec import ModelError, Workload, routed_experts

ops = torch.ops.castcore

if TYPE_CHECKING:
    from castcore.workload.models import BuiltModel


@dataclass(frozen=True)
class ExpertGroups:
    """The process groups one device's experts module talks over, and how many ranks share its tokens."""

    ep: Any  # the expert-parallel group of the dispatch and combine all_to_all (ep > tp), else None
    tp: Any  # the ranks holding the same tokens (the tensor-parallel group), or None when tp == 1
    ep_size: int
    etp_size: int  # the devices an expert is split over (tp/ep when ep < tp)
    token_share: int  # ranks the block's tokens are replicated over (tp)
    kernels: str | None = None  # "low-latency": dispatch and combine as DeepEP's low-latency kernels run them

    @property
    def replicated(self) -> bool:
        """Every device of the expert-parallel group holds every token: nothing to dispatch."""
        return self.ep_size <= self.token_share


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


def with_model_routing(workload: Workload, built: BuiltModel) -> Workload:
    """A mixture of experts routes as real traffic does unless --expert-skew says otherwise: its family's fitted
    skew (castcore.recording.routing.model_skew), said in a note. Only castcore's experts forwards (deployed
    kernels, or --ep) know their top-k and so price a skew: an eager graph's experts run as they are."""
    priced = workload.ep > 1 or (workload.fuse and not workload.train)
    if workload.expert_skew is not None or not priced or not routed_experts(built.config or {}):
        return workload
    skew = routing.model_skew(built.config)
    built.notes.append(
        f"MoE routing taken as uneven as served traffic: expert loads a power law of exponent {skew} (the fits "
        "NVIDIA's AIConfigurator collectors publish: 1.01 for DeepSeek-V3's architecture, 1.2 for every other "
        "family); an expert skew of 0 prices it balanced"
    )
    return replace(workload, expert_skew=skew)


def _grouped(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, transposed: bool) -> torch.Tensor:
    # As transformers' grouped_mm experts run it: [rows, in] x [experts, in, out] grouped by offsets.
    return torch._grouped_mm(x, weight if transposed else weight.transpose(-2, -1), offs=offsets)


def _busiest_rows(local_experts: int, ranks: int, tokens: float, top_k: int) -> int:
    """Rows the busiest of ``ranks`` expert-parallel ranks receives when the group routes ``tokens`` tokens in all
    (castcore.recording.routing.busiest_rows: uneven even when balanced, more under the capture's routing skew),
    whole rows: a batch of one token runs about 3 of its 8 rows on the busiest of 8 devices, not 8."""
    skew = routing.recorded().get("expert_skew") or 0.0
    return max(1, round(routing.busiest_rows(local_experts * ranks, ranks, tokens, top_k, skew)))


def _busiest_touched(local_experts: int, ranks: int, tokens: float, top_k: int) -> float | None:
    """Under a routing skew, how many of its experts the busiest rank runs (castcore.recording.routing.busiest_rank:
    its rows crowd onto the hot ones); None when balanced, where its rows' even picks decide."""
    skew = routing.recorded().get("expert_skew")
    if not skew or ranks <= 1:
        return None
    return routing.busiest_rank(local_experts * ranks, ranks, tokens, top_k, skew)[1]


def _expert_parallel_forward(groups: ExpertGroups):
    return _local_experts_forward(groups) if groups.replicated else _dispatched_forward(groups)


# Each forward keeps its body whole and calls _grouped by its global name, which quantization swaps
# (castcore.deploy.quantize.layers); it hands it to _experts.


def _local_experts_forward(groups: ExpertGroups):
    """ep <= tp: every device of the tensor-parallel group already holds every token, so nothing is dispatched."""
    import torch.distributed._functional_collectives as funcol

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        # sort, products and combine stay on this device: one fused MoE kernel's parts, as engines run them
        with routing.expert_routing(top_k=top_k_index.shape[-1], fused=True):
            tokens, top_k = top_k_index.shape
            # The (token, expert) pairs routed to this device's experts, as many as the busiest device gets, with
            # local expert ids. Captures run on fake tensors: what matters is how many pairs are taken.
            pairs = min(tokens * top_k, _busiest_rows(self.num_experts, groups.ep_size, tokens, top_k))
            local = top_k_index.reshape(-1, 1).narrow(0, 0, pairs) % self.num_experts
            rows, order, offsets = ops.moe_permute(hidden_states, local, self.num_experts)
            if getattr(
                self, "castcore_weights_on_input", False
            ):  # Llama 4: the router weight scales the input
                rows = rows * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(rows.dtype)
                top_k_weights = torch.ones_like(top_k_weights)
            with routing.expert_routing(
                touched=_busiest_touched(self.num_experts, groups.ep_size, tokens, top_k)
            ):
                out = _experts(self, rows, offsets, _grouped)
            bias = getattr(self, "down_proj_bias", None) if getattr(self, "has_bias", False) else None
            combined = ops.moe_unpermute(
                out, order, top_k_weights, bias, offsets if bias is not None else None
            )
        # the local experts' share of each token, and with ep < tp each expert's share of its intermediate,
        # summed here or, with a shared expert, by the block (castcore.deploy.parallel.tensor_shards)
        if getattr(self, "castcore_block_sums", False):
            return combined
        return funcol.all_reduce(combined, "sum", groups.tp)

    return forward


def _dispatched_forward(groups: ExpertGroups):
    """ep > tp (attention data-parallel): each device holds its own tokens, sent to the experts' devices."""
    import torch.distributed._functional_collectives as funcol

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        with routing.expert_routing(top_k=top_k_index.shape[-1]):
            tokens = hidden_states.shape[0]
            top_k = top_k_index.shape[-1]
            share = -(-tokens // groups.token_share)  # this rank's tokens (the larger share)
            if share < tokens:
                hidden_states, top_k_index, top_k_weights = (
                    t.narrow(0, 0, share) for t in (hidden_states, top_k_index, top_k_weights)
                )
            # Dispatch: the routed copies sorted by expert (one kernel), then sent to their experts' devices.
            routed, order, _ = ops.moe_permute(hidden_states, top_k_index, self.num_experts * groups.ep_size)
            if getattr(
                self, "castcore_weights_on_input", False
            ):  # Llama 4: the router weight scales the input
                routed = routed * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(routed.dtype)
                top_k_weights = torch.ones_like(top_k_weights)
            splits = _splits(share * top_k, groups.ep_size)
            # The busiest rank sets the pace: under a routing skew it receives more than its even share. The
            # group's tokens: each of its ep ranks routes 1/token_share of its tensor-parallel group's.
            group_tokens = tokens * groups.ep_size / groups.token_share
            busiest = _splits(
                _busiest_rows(self.num_experts, groups.ep_size, group_tokens, top_k), groups.ep_size
            )
            with collective_kernels(groups.kernels):
                received = funcol.all_to_all_single(routed, busiest, splits, groups.ep)
            # Balanced routing: the received rows split evenly across the local experts.
            local, count = self.num_experts, received.shape[0]
            offsets = torch.arange(1, local + 1, dtype=torch.int32, device=received.device) * (count // local)
            # only the local experts are a fused kernel's parts: the sort and combine move rows over the network
            with routing.expert_routing(
                touched=_busiest_touched(self.num_experts, groups.ep_size, group_tokens, top_k), fused=True
            ):
                out = _experts(self, received, offsets, _grouped)
            if getattr(self, "has_bias", False):
                out.add_(self.down_proj_bias[_row_experts(local, count, out.device)])
            # Combine: back to the tokens' devices, then weighted by the router and summed per token (one kernel).
            with collective_kernels(groups.kernels):
                back = funcol.all_to_all_single(out, splits, busiest, groups.ep)
            combined = ops.moe_unpermute(back, order, top_k_weights)
            if groups.token_share > 1:
                combined = funcol.all_gather_single(combined, 0, groups.tp)
                if combined.shape[0] != tokens:
                    combined = combined.narrow(0, 0, tokens)
            return combined

    return forward


def _experts(self, rows: torch.Tensor, offsets: torch.Tensor, grouped) -> torch.Tensor:
    """The local experts over ``rows`` grouped by expert (``offsets``): the two grouped products ``grouped`` runs,
    the activation between them (castcore's fused one where castcore.deploy.kernels.moe gave it, its first
    bias in it)."""
    transposed = bool(getattr(self, "is_transposed", False))
    has_gate = getattr(self, "has_gate", True)
    out = grouped(rows, self.gate_up_proj if has_gate else self.up_proj, offsets, transposed)
    if hasattr(self, "castcore_gate"):
        out = self.castcore_gate(out, offsets)
    else:
        if getattr(self, "has_bias", False):
            bias = self.gate_up_proj_bias if has_gate else self.up_proj_bias
            out.add_(bias[_row_experts(self.num_experts, rows.shape[0], rows.device)])
        out = self._apply_gate(out) if has_gate else self.act_fn(out)
    return grouped(out, self.down_proj, offsets, transposed)


def _row_experts(local: int, count: int, device: torch.device) -> torch.Tensor:
    """Each of ``count`` rows' expert when they are split evenly over ``local`` experts (for the biases)."""
    return torch.arange(count, device=device) * local // max(count, 1)
