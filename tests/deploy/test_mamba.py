"""Nemotron-H's Mamba-2 mixers as engines run them: the rewritten layers compute transformers' numbers (a prompt
chunked, then decode steps over the recurrent state), the scan's work worked by hand, tensor parallelism splitting
the heads and groups, and mixed batches under traffic with each request's state in the KV pool. Tiny config in
tests/data (one Mamba-2 layer of 8 heads of 16, 2 groups, state 16, convolution width 4, chunks of 16; one
attention layer; two MLPs). Needs the newest transformers castcore is tested on (not a ``models`` test)."""

from __future__ import annotations

import torch

from castcore.deploy.kernels.fusing import rewrite
from castcore.hf.cache import cache_argument
from castcore.workload.models import BuiltModel

from tests.deploy.test_fusing import DATA, real_model

NEMOTRON_H = str(DATA / "tiny-nemotron-h.json")


def test_the_rewrite_computes_what_transformers_does_over_a_prompt_and_decode_steps():
    from transformers import DynamicCache

    model = real_model("tiny-nemotron-h.json")
    prompt, steps = torch.randint(3, 200, (2, 40)), [torch.randint(3, 200, (2, 1)) for _ in range(3)]

    def run():
        cache = {cache_argument(model): DynamicCache(config=model.config)}
        with torch.no_grad():
            return [model(x, **cache, use_cache=True).logits for x in (prompt, *steps)]

    eager = run()
    built = BuiltModel(model=model)
    done, _ = rewrite(built)
    assert any("Mamba-2" in line for line in done), done
    with built.while_capturing():
        fused = run()
    for want, got in zip(eager, fused):  # a prompt of two and a half 16-token chunks, then the state carried
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
