"""An engine's own time around the kernels: CPU work every iteration, the path of a request before its first token,
and the batch sizes its CUDA graphs (Ascend: ACL graphs) were captured at, per engine preset, each number with
where it comes from.

An iteration's seconds are ``max(kernels, overlapped CPU) + serial CPU``: the CPU work is ``step_s`` plus
``sequence_s`` per scheduled sequence, and ``overlap`` is the share of it an engine runs while the previous
iteration's kernels run (an overlap or async scheduler); the rest waits for the kernels. A decode-only batch of up
to the largest capture size replays the graph of the next captured size (padded to it, so priced at that many
sequences; the padding rows sample nothing); without padding (TensorRT-LLM's default) a size that was not captured
runs eagerly. Larger batches, mixed batches and ``enforce_eager`` run eagerly: their kernels cannot start faster
than the CPU launches them, ``launch_s`` each, so such an iteration takes at least ``kernels x launch_s``. vLLM's
piecewise graphs cover mixed batches of up to the largest capture size in tokens: those are not launch-bound.
``request_s`` delays a request's entry into the scheduler: its path outside the forward passes before its first
token reaches the client (the HTTP request, tokenizing, the server's hops, streaming the token back), not the
engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from castcore.simulation.chunks import Chunk, StepTime
from castcore.simulation.presets import EngineLimits

_V1_LOOP = (
    "openfabric-systems/simllm PR #204 (2026-09): vLLM V1's engine loop on a stub executor, all-decode scheduling "
    "about 12.7 us per running request at the cap (the PR flags its run-to-run drift: an order of magnitude)"
)
_GAP = (
    "vllm-project/vllm issue #10634 (2024-11): the gap left between decode steps once scheduling runs ahead of "
    "the GPU is put at 200-300 us"
)
_LAUNCH = (
    "sgl-project/sglang PR #1401 (2024-09): Llama-3-8B decode at batch 1 (FlashInfer) 8.23 ms eager and 7.35 ms "
    "with CUDA graphs; eager is launch-bound there, so 8.23 ms over the 404 kernels castcore counts in that step "
    "is 20 us of CPU per kernel"
)
_ASSUMED = (
    "assumed: no per-iteration CPU figure of this engine is published, so vLLM V1's (above) is taken, hidden "
    "behind the kernels by the overlap scheduler"
)
_SGLANG_MOCK = (
    "tenstorrent/tt-inference-server issue #3560 (2026-05): SGLang serving one user through its OpenAI chat "
    "endpoint (vllm bench serve, 128-token prompts) over a model whose every forward busy-waits 2.632 ms on the "
    "CPU, so nothing of the engine's own time hides behind it: median TTFT 9.54 ms, TPOT 2.94 ms"
)
_REQUEST = (
    "per request 6.6 ms (the HTTP request, chat template and tokenizing, the hops between the server's processes, "
    "detokenizing and streaming the token): the mock's TTFT less its prefill forward and that iteration's 0.31 ms"
)
_REQUEST_ASSUMED = (
    "per request 6.6 ms, assumed: SGLang's measured path (see the sglang preset), since this engine's OpenAI "
    "server has the same parts (a front end that templates and tokenizes, hands the request to the engine's "
    "process and streams the detokenized tokens back) and no measurement of its own was found"
)


@dataclasses.dataclass(frozen=True)
class Overheads:
    """One engine's CPU costs (seconds) and graph capture rule; ``sources`` says where each comes from."""

    step_s: float
    sequence_s: float
    overlap: float  # share of the per-iteration CPU work run while the previous iteration's kernels run
    request_s: float
    launch_s: float
    graphs: str  # what the engine's graphs are called
    sizes: Callable[[EngineLimits], list[int]]  # the decode batch sizes captured, ascending
    padding: bool  # a batch between captured sizes replays the next one (else it runs eagerly)
    piecewise: bool  # mixed batches up to the largest size run piecewise graphs
    sources: tuple[str, ...]


def _vllm_sizes(limits: EngineLimits) -> list[int]:
    """1, 2, 4, every 8 to 248, every 16 from 256, up to min(2 x max_num_seqs, 512), within the token budget."""
    most = limits.max_capture_size or min(2 * limits.max_running_requests, 512, limits.max_batched_tokens)
    return [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, most + 1, 16)] if s <= most] or [most]


def _sglang_sizes(limits: EngineLimits) -> list[int]:
    """1, 2, 4, 8, 12, every 8 to 256, every 16 to 496, every 32 from 512, up to cuda_graph_max_bs."""
    most = limits.max_capture_size or min(256, limits.max_running_requests)
    ladder = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 497, 16), *range(512, most + 1, 32)]
    return [s for s in ladder if s <= most] or [most]


def _trtllm_sizes(limits: EngineLimits) -> list[int]:
    """1 to 31, 32, 64, 128 and powers of two from 256, up to max_batch_size 128 (no padding by default)."""
    most = limits.max_capture_size or min(128, limits.max_running_requests)
    ladder = [*range(1, 33), *(2**k for k in range(6, 16))]
    return [s for s in ladder if s <= most] or [most]


_VLLM_COMPILATION = (
    "vllm-project/vllm vllm/config/compilation.py, CompilationConfig.max_cudagraph_capture_size and "
    "cudagraph_mode FULL_AND_PIECEWISE (v0.11-0.12 line): sizes 1, 2, 4, every 8 to 248, every 16 from 256 "
    "up to min(2 x max_num_seqs, 512) within max_num_batched_tokens, padded up; larger batches eager"
)
REQUEST_S = 6.6e-3  # the path of a request outside the forward passes (SGLang's, measured: _REQUEST)
# SGLang's and TensorRT-LLM's CPU figures per iteration: vLLM's, assumed, hidden by their overlap schedulers.
_OVERLAPPED = dict(
    step_s=250e-6,
    sequence_s=12.7e-6,
    overlap=1.0,
    request_s=REQUEST_S,
    launch_s=20e-6,
    graphs="CUDA graphs",
    piecewise=False,
)

ENGINES: dict[str, Overheads] = {
    "vllm": Overheads(
        step_s=250e-6,
        sequence_s=12.7e-6,
        overlap=0.0,  # async scheduling is opt-in (--async-scheduling) in the v0.11 line
        request_s=REQUEST_S,
        launch_s=20e-6,
        graphs="CUDA graphs",
        sizes=_vllm_sizes,
        padding=True,
        piecewise=True,
        sources=(
            f"per iteration 250 us: {_GAP}",
            f"per sequence 12.7 us: {_V1_LOOP}",
            "no overlap: vllm-project/vllm PR #19970 (2025-06) adds async scheduling as an opt-in flag",
            _REQUEST_ASSUMED,
            f"eager 20 us per kernel: {_LAUNCH}",
            f"capture sizes: {_VLLM_COMPILATION}",
            "on Ascend, vllm-ascend's ACL graphs start from the same sizes and padding "
            "(docs.vllm.ai/projects/ascend developer_guide/Design_Documents/ACL_Graph, read 2026-11); their "
            "trimming to the device's stream budget is not modelled",
        ),
    ),
    "sglang": Overheads(
        **_OVERLAPPED,  # type: ignore[arg-type]
        sizes=_sglang_sizes,
        padding=True,
        sources=(
            f"per iteration and sequence: {_ASSUMED} (LMSYS blog 'SGLang v0.4', 2024-12: the zero-overhead "
            "scheduler leaves no GPU idle between decode batches); it agrees with SGLang's own serial 0.31 ms a "
            f"decode step at one sequence: {_SGLANG_MOCK}",
            f"{_REQUEST}; {_SGLANG_MOCK}",
            f"eager 20 us per kernel: {_LAUNCH}",
            "capture sizes: sgl-project/sglang python/sglang/srt/server_args.py, _generate_cuda_graph_batch_sizes "
            "and cuda_graph_max_bs 256 for 60-160 GB GPUs at TP < 4 (v0.5 line), padded up; mixed batches eager",
        ),
    ),
    "trtllm": Overheads(
        **_OVERLAPPED,  # type: ignore[arg-type]
        sizes=_trtllm_sizes,
        padding=False,
        sources=(
            f"per iteration and sequence: {_ASSUMED} (nvidia.github.io/TensorRT-LLM features/overlap-scheduler: "
            "on by default)",
            _REQUEST_ASSUMED,
            f"eager 20 us per kernel: {_LAUNCH}",
            "capture sizes: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, CudaGraphConfig (1.0 line): "
            "max_batch_size 128, enable_padding False, sizes 1-31, 32, 64, 128; a size not captured runs eager",
        ),
    ),
}


def with_cpu(costs: Overheads, kernels_s: float, sequences: int) -> float:
    """An iteration of ``sequences`` whose kernels take ``kernels_s``, with the engine's CPU work: the overlapped
    share of it runs beside the kernels, the rest after them."""
    cpu = costs.step_s + costs.sequence_s * sequences
    return max(kernels_s, costs.overlap * cpu) + (1 - costs.overlap) * cpu


class EngineStep:
    """``step`` (the kernels' seconds of a batch) with the engine's overheads (see the module docstring);
    ``kernels``: the kernels one iteration launches; ``decode_tokens``: a decoding sequence's new tokens (1, or
    1 + draft tokens under speculation)."""

    def __init__(
        self, step: StepTime, engine: str, limits: EngineLimits, kernels: int, decode_tokens: int = 1
    ):
        self.step, self.costs = step, ENGINES[engine]
        costs = self.costs
        self.sizes = [] if limits.enforce_eager else costs.sizes(limits)
        self.most = self.sizes[-1] if self.sizes else 0
        self.decode_tokens = decode_tokens
        # Per batch size up to the largest capture: the size replayed, or 0 where it runs eagerly.
        self.replayed = [0] * (self.most + 1)
        for size in range(1, self.most + 1):
            following = next(s for s in self.sizes if s >= size)
            self.replayed[size] = following if costs.padding or following == size else 0
        self.filler = Chunk(decode_tokens, 0, False)
        self.launch_bound = kernels * costs.launch_s

    def __call__(self, chunks: Sequence[Chunk]) -> float:
        n = len(chunks)
        q = self.decode_tokens
        if n <= self.most and all(c[0] == q for c in chunks):
            replayed = self.replayed[n]
            kernels = (
                self.step([*chunks, *[self.filler] * (replayed - n)])
                if replayed > n
                else (self.step(chunks) if replayed else max(self.step(chunks), self.launch_bound))
            )
        elif self.most and self.costs.piecewise and sum(c[0] for c in chunks) <= self.most:
            kernels = self.step(chunks)
        else:
            kernels = max(self.step(chunks), self.launch_bound)
        return with_cpu(self.costs, kernels, n)

    def decode_times(self, cached: Sequence[int], steps: int) -> list[float] | None:
        """A decode-only run's iterations (castcore.simulation.decode_run) as ``self`` prices each: padded to
        its capture size, or eager; None where the step model has no such runs."""
        own = getattr(self.step, "decode_times", None)
        if own is None or self.decode_tokens != 1:
            return None
        n = len(cached)
        replayed = self.replayed[n] if n <= self.most else 0
        times = own(cached, steps, max(0, replayed - n))
        if times is None:
            return None
        if not replayed:
            times = [max(t, self.launch_bound) for t in times]
        return [with_cpu(self.costs, t, n) for t in times]

    def summary(self) -> dict[str, object]:
        """What the run used, for the simulation's summary."""
        costs = self.costs
        return {
            "graphs": "off (eager)" if not self.sizes else costs.graphs,
            "max_capture_size": self.most or None,
            "padding": costs.padding,
            "step_cpu_ms": costs.step_s * 1e3,
            "sequence_cpu_ms": costs.sequence_s * 1e3,
            "overlap": costs.overlap,
            "request_cpu_ms": costs.request_s * 1e3,
            "eager_launch_ms": costs.launch_s * 1e3,
        }


def describe(engine: str, summary: dict[str, object]) -> str:
    """The one line the text summary shows."""
    graphs = summary["graphs"]
    if summary["max_capture_size"]:
        graphs = f"{graphs} up to batch {summary['max_capture_size']}"
        graphs += "" if summary["padding"] else " (no padding)"
    hidden = f", {summary['overlap']:.0%} overlapped" if summary["overlap"] else ""
    return (
        f"engine overheads ({engine}): {graphs}; CPU {summary['step_cpu_ms']:g} ms + "
        f"{summary['sequence_cpu_ms']:g} ms per sequence per iteration{hidden}, "
        f"{summary['request_cpu_ms']:g} ms per request before its first token"
    )
