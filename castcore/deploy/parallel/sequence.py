"""Sequence parallelism (``--sp``) on top of tensor parallelism, as Megatron-LM runs it.

Between the blocks the residual stream is split by tokens: every device holds its 1/n of the batch's
tokens as a plain local tensor [1, batch x seq / n, hidden] (Megatron's [seq, batch, hidden] layout split
along the sequence, so every collective works on contiguous rows and no op copies), and norms, residual adds
and other elementwise ops run on 1/n of the tokens. Each attention and MLP block all-gathers its input once
(a forward pre-hook, whether the layer passes it by position or as ``hidden_states``) back to
[batch, seq, hidden], and its row-parallel output projection reduce-scatters the partial sums instead of
all-reducing them. The vocab-parallel embedding is sharded by hand as vLLM's VocabParallelEmbedding runs (ids
outside the device's vocab rows masked, their rows zeroed): its partial sums reach the first layer whole, so
the model code between (positions, masks) sees the whole sequence, and are reduce-scattered there; a
replicated (tied) embedding is just cut to the device's tokens. After the last layer the final hidden states
are all-gathered: for last-token logits only each device's share of the sequences' last tokens, and the LM head
reads [batch, 1, hidden]. A decode step (one token per sequence) is not split and runs as plain TP.
"""

from __future__ import annotations

from typing import Any

import torch

from castcore.options.catalog import say
from castcore.workload.models import BuiltModel
from castcore.deploy.parallel.tensor_plan import ROW_KINDS, TensorParallel
from castcore.deploy.parallel.tensor_shards import _replace
from castcore.workload.spec import ModelError

ATTENTION = ("self_attn", "attn", "attention", "self_attention")
MLP = ("mlp", "feed_forward", "ffn")


def decoder_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList] | None:
    """The model's decoder layers: the ModuleList as long as the config's num_hidden_layers (else the longest
    ModuleList), and its path."""
    config = getattr(model, "config", None)
    config = getattr(config, "text_config", None) or config
    count = getattr(config, "num_hidden_layers", None)
    lists = [(path, m) for path, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        return None
    exact = [(path, m) for path, m in lists if len(m) == count]
    return (exact or sorted(lists, key=lambda item: -len(item[1])))[0]


def block_children(layer: torch.nn.Module, path: str) -> list[torch.nn.Module]:
    """A decoder layer's attention and MLP blocks, found by their names."""
    children = dict(layer.named_children())
    found = [next((children[n] for n in names if n in children), None) for names in (ATTENTION, MLP)]
    if None in found:
        raise ModelError(
            f"{say('sp', True)}: {path} has no attention block named {'/'.join(ATTENTION)} and MLP "
            f"named {'/'.join(MLP)}; sequence parallelism covers decoder layers built that way (drop "
            f"{say('sp')})"
        )
    return found


class _Tokens:
    """The step's batch and sequence length, learnt where the first layer is entered; the collectives' group."""

    def __init__(self, mesh: Any, n: int):
        self.mesh, self.n, self.batch, self.seq = mesh, n, 0, 0

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        """Partial sums [batch, seq, hidden] -> this device's tokens, summed: [1, batch x seq / n, hidden]."""
        import torch.distributed._functional_collectives as funcol

        return funcol.reduce_scatter_single(x.reshape(-1, x.shape[-1]), "sum", 0, self.mesh).unsqueeze(0)

    def gather(self, x: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """Every device's tokens (or ``rows`` of them each) all-gathered, as [batch x seq (or n x rows), hidden]."""
        import torch.distributed._functional_collectives as funcol

        flat = x.reshape(-1, x.shape[-1])
        return funcol.all_gather_single(flat if rows is None else flat.narrow(0, 0, rows), 0, self.mesh)


def _first_layer(tokens: _Tokens, summed: bool):
    """A pre-hook on the first layer: the embedding's partial sums reduce-scattered to this device's tokens (a
    replicated embedding's output just cut to them)."""

    def local(x: torch.Tensor) -> torch.Tensor:
        tokens.batch, tokens.seq = x.shape[0], x.shape[1]
        if summed:
            return tokens.scatter(x)
        return x.reshape(1, -1, x.shape[-1]).narrow(1, 0, x.shape[0] * x.shape[1] // tokens.n)

    def hook(module, args, kwargs):
        if args and isinstance(args[0], torch.Tensor):
            return (local(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": local(kwargs["hidden_states"])}

    return hook


def _gather_input(tokens: _Tokens):
    """A pre-hook all-gathering a block's input tokens back to [batch, seq, hidden], by position or keyword."""

    def whole(x: torch.Tensor) -> torch.Tensor:
        return tokens.gather(x).view(tokens.batch, tokens.seq, x.shape[-1])

    def hook(module, args, kwargs):
        if isinstance(kwargs.get("hidden_states"), torch.Tensor):
            return args, {**kwargs, "hidden_states": whole(kwargs["hidden_states"])}
        if args and isinstance(args[0], torch.Tensor):
            return (whole(args[0]), *args[1:]), kwargs
        return None

    return hook


def _gather_output(tokens: _Tokens, last_only: bool):
    """A forward hook on the base model: the final hidden states all-gathered for the LM head; for last-token
    logits each device's share of the sequences' last tokens only, as [batch, 1, hidden]."""

    def gathered(x: torch.Tensor) -> torch.Tensor:
        if not last_only:
            return tokens.gather(x).view(tokens.batch, tokens.seq, x.shape[-1])
        share = -(-tokens.batch // tokens.n)
        rows = tokens.gather(x, share)
        return (rows if rows.shape[0] == tokens.batch else rows.narrow(0, 0, tokens.batch)).unsqueeze(1)

    def hook(module, args, out):
        if isinstance(out, tuple):
            return (gathered(out[0]), *out[1:])
        out.last_hidden_state = gathered(out.last_hidden_state)
        return out

    return hook


def _vocab_parallel_embedding(embedding: torch.nn.Module, n: int) -> None:
    """vLLM's VocabParallelEmbedding on one device: vocab/n rows; ids outside them masked to row 0 before the
    lookup and their outputs zeroed after, leaving partial sums for the first layer to reduce-scatter."""
    vocab, hidden = embedding.weight.shape
    _replace(embedding, "weight", (vocab // n, hidden))
    masks: list[torch.Tensor] = []

    def before(module, args):
        ids = args[0]
        mask = (ids < 0) | (ids >= vocab // n)  # this device's rows are [0, vocab / n): rank 0's
        masks.append(mask)
        return (ids.masked_fill(mask, 0), *args[1:])

    def after(module, args, out):
        return out.masked_fill_(masks.pop().unsqueeze(-1), 0)

    embedding.register_forward_pre_hook(before)
    embedding.register_forward_hook(after)


def sequence_parallel(built: BuiltModel, mesh: Any, n: int, seq: int, info: TensorParallel) -> None:
    """Hook ``built``'s model for sequence parallelism over the ``n`` ranks of ``mesh``, after its tensor-parallel
    plan left row-parallel outputs as partial sums: see the module docstring."""
    model = built.model
    found = decoder_layers(model)
    if found is None or not hasattr(model, "base_model"):
        raise ModelError(
            f"{say('sp', True)}: {type(model).__name__} is not a transformers model with decoder "
            f"layers; sequence parallelism covers the causal LMs castcore builds (drop {say('sp')})"
        )
    if seq % n:
        raise ModelError(
            f"{say('sp', True)} splits the sequence over {say('tp', n)} devices: use a {say('seq')} that "
            f"divides by {n}"
        )
    tokens = _Tokens(mesh, n)
    path, layers = found
    for index, layer in enumerate(layers):
        for block in block_children(layer, f"{path}.{index}"):
            block.register_forward_pre_hook(_gather_input(tokens), with_kwargs=True)
    summed = False
    for name, kind in info.plan.items():
        if kind in ROW_KINDS:
            model.get_submodule(name).register_forward_hook(lambda module, args, out: tokens.scatter(out))
        elif kind == "embedding_sp":
            _vocab_parallel_embedding(model.get_submodule(name), n)
            summed = True
    layers[0].register_forward_pre_hook(_first_layer(tokens, summed), with_kwargs=True)
    keep = built.kwargs.get("logits_to_keep")
    last_only = isinstance(keep, torch.Tensor) and keep.numel() == 1
    if last_only:  # the gathered last tokens are [batch, 1, hidden]: the LM head reads position 0
        built.kwargs["logits_to_keep"] = torch.zeros((1,), dtype=keep.dtype, device=keep.device)
    model.base_model.register_forward_hook(_gather_output(tokens, last_only))
    built.description += ", sequence parallel"
