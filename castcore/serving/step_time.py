"""An engine iteration's time from a few captures of a deployment, fast enough for a request-level simulation.

An iteration over mixed chunks (castcore.serving.mixed_batch) costs three kinds of work:

- the body: every op but attention and the LM head, a function of the packed tokens T alone (the linear layers,
  norms, MoE and collectives run over all of them at once);
- the LM head, a function of the sequences S that sample a token;
- attention, one ``castcore::varlen_attention`` kernel a layer, a function of every chunk's length and KV length
  (multi-head latent attention and Gated DeltaNet: ``castcore::varlen_latent_attention`` and
  ``castcore::varlen_gated_delta_rule``, Mamba-2: ``castcore::varlen_ssd_scan``, one kernel over the decodes and
  one over the prompt chunks).

So the deployment is captured as mixed batches at a ladder of token counts (castcore.serving.ladder_points: powers
of four up to the token budget, each captured when an iteration first needs it, or read as priced from the capture
cache), each op's compute, memory, communication and launch time kept per ladder point, and an iteration's body and head
are each op's parts interpolated linearly at its T or S and added as the roofline adds them
(max(compute, memory) + the rest). Attention is castcore's own estimate of that iteration's kernel, asked of the
plugins once an iteration. ``agreement`` compares this with a direct capture of the same batches.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from castcore.recording.invoke import OpInvoke
from castcore.serving import attention_pricing
from castcore.serving.ladder_points import Parts, Point, is_head, ladder
from castcore.serving.mixed_batch import PACKED_ATTENTION, Chunk, capture_mixed, packed_workload
from castcore.serving.packed_calls import SPLIT, attention_call, attention_kind

if TYPE_CHECKING:
    from castcore.devices.profile import DeviceProfile
    from castcore.report.records import Report
    from castcore.deploy.pipeline import Pipeline
    from castcore.workload.spec import Workload


class StepTimes:
    """Seconds of an iteration of ``base``'s deployment: ``step_times([(new, cached), ...])``; ``samples`` in a
    Chunk says which sequences sample (a pair counts as sampling, a triple says). The ladder's captures are made as
    iterations need them (two bracket each token count), the largest and the smallest at once."""

    def __init__(
        self,
        pipeline: Pipeline,
        base: Workload,
        device: str | DeviceProfile | None,
        max_tokens: int,
        max_sampled: int,
    ):
        self.pipeline, self.profile = pipeline, pipeline.host.device(device)
        self.base = base
        self.points = ladder(max_tokens)
        self.max_sampled = max_sampled
        # The ladder capture each count of sampling sequences comes from (at T tokens, min(T, max_sampled) sample).
        self.sampled_at = {min(t, max_sampled): t for t in reversed(self.points)}
        self.sampled_points = sorted(self.sampled_at)
        self._reports: dict[int, Report] = {}  # the smallest ladder capture, read whole
        self._stage_of: dict[int, list[int]] = {}  # per such capture, each record's pipeline stage
        self._points: dict[int, Point] = {}
        self._parts: dict[tuple[str, int, int], Parts] = {}
        self.stages = Stages.of(base) if base.pp > 1 else None
        # the activations of a full token budget (the KV cache rule reads them)
        self.activation_peak_bytes = self.point(self.points[-1]).activation_peak_bytes or 0
        # Attention kernels of one shape (a layer kind), and how many an iteration runs in each stage.
        kinds: dict[Any, list] = {}
        smallest = self._report(self.points[0])
        self.kernels = sum(1 for r in smallest.records if r.estimate.time_s > 0)  # launched per iteration
        for record, stage in zip(smallest.records, self._stage_of[self.points[0]]):
            if record.invoke.name in PACKED_ATTENTION:
                template = attention_kind(record.invoke)
                kinds.setdefault(template.key, [[0] * base.pp, template])[0][stage] += 1
        self.attention = [(counts, template) for counts, template in kinds.values()]
        self._kernels = [self._pricing(template, max_tokens) for _, template in self.attention]
        self._body: dict[int, list[float]] = {}  # per token count, each stage's body
        self._head: dict[int, list[float]] = {}  # per count of sampling sequences, each stage's LM head
        # the weights a device holds and the KV bytes a token takes (castcore.serving.kv_capacity's probe)
        # (and the state a sequence holds, a hybrid model's)
        self.probed: tuple[int, int, int] | None = None

    def _chunks(self, tokens: int) -> list[Chunk]:
        """The ladder's batch at ``tokens``: one prompt chunk and single tokens, min(tokens, max_sampled) of them
        sampling."""
        sampled = min(tokens, self.max_sampled)
        return [Chunk(tokens - sampled + 1, 0), *[Chunk(1, 0)] * (sampled - 1)]

    def _capture(self, tokens: int) -> tuple[Report, list[int]]:
        # only the full token budget's footprint is read: the analysis costs more than the pricing
        report = capture_mixed(
            self.pipeline, self.base, self._chunks(tokens), self.profile, memory=tokens == self.points[-1]
        )
        return report, self.stages.assign(report) if self.stages is not None else [0] * len(report.records)

    def _report(self, tokens: int) -> Report:
        """The ladder's capture at ``tokens``, kept whole (the smallest is read so: its attention calls are the
        templates of the iterations' kernels)."""
        if tokens not in self._reports:
            self._reports[tokens], self._stage_of[tokens] = self._capture(tokens)
        return self._reports[tokens]

    def point(self, tokens: int) -> Point:
        """The ladder's capture at ``tokens`` as the model reads it, from the capture cache's priced points
        where the pipeline has one."""
        if tokens not in self._points:
            if tokens in self._reports:
                found = Point.of(self._reports[tokens], self._stage_of[tokens])
            else:

                def make() -> dict[str, Any]:
                    return Point.of(*self._capture(tokens)).plain()

                priced = getattr(self.pipeline.capture_step, "priced", None)
                chunks = self._chunks(tokens)
                data = (
                    make()
                    if priced is None
                    else priced(
                        self.pipeline.host,
                        packed_workload(self.base, chunks),
                        self.profile,
                        tuple((c.new, c.cached, bool(c.samples)) for c in chunks),
                        make,
                    )
                )
                try:
                    found = Point.from_plain(data)
                except (KeyError, TypeError, ValueError):  # an altered entry: priced again
                    found = Point.from_plain(make())
            self._points[tokens] = found
        return self._points[tokens]

    def _at(self, kind: str, x: int, stage: int) -> float:
        """One stage's body at ``x`` tokens, or its head at ``x`` sampling sequences, from the two captures around
        x."""
        points = self.points if kind == "body" else self.sampled_points
        if len(points) == 1:
            points = points * 2
        i = min(max(bisect.bisect_left(points, x), 1), len(points) - 1)
        parts = self._parts.get((kind, i, stage))
        if parts is None:
            pair = points[i - 1 : i + 1]
            tokens = pair if kind == "body" else [self.sampled_at[p] for p in pair]
            body = kind == "body"
            parts = self._parts[(kind, i, stage)] = Parts.of(
                pair,
                [
                    [
                        (module, name, split)
                        for module, name, s, split in self.point(t).ops
                        if s == stage
                        and (
                            name not in PACKED_ATTENTION and not is_head(module) if body else is_head(module)
                        )
                    ]
                    for t in tokens
                ],
            )
        return parts.at(x)

    def stage_times(self, given: Sequence[Chunk | tuple]) -> list[float]:
        """Seconds of each pipeline stage's share of the iteration (one stage without ``--pp``)."""
        chunks = [c if isinstance(c, Chunk) else Chunk(*c) for c in given]
        tokens = sum(c.new for c in chunks)
        sampled = sum(1 for c in chunks if c.samples)
        body = self._body.get(tokens)
        if body is None:
            body = self._body[tokens] = [self._at("body", tokens, stage) for stage in range(self.base.pp)]
        head = self._head.get(sampled)
        if head is None:
            head = self._head[sampled] = [
                self._at("head", sampled, stage) if sampled else 0.0 for stage in range(self.base.pp)
            ]
        return self._stages(body, head, self.attention_kernels(chunks))

    def _stages(self, body: list[float], head: list[float], kernels: list[float]) -> list[float]:
        return [
            b + h + sum(counts[stage] * k for (counts, _), k in zip(self.attention, kernels))
            for stage, (b, h) in enumerate(zip(body, head))
        ]

    def decode_times(self, cached: Sequence[int], steps: int, idle: int = 0) -> list[float] | None:
        """The seconds of ``steps`` decode-only iterations of sequences at ``cached`` KV tokens, each a token
        longer every iteration, beside ``idle`` padding sequences of one token that sample nothing (a CUDA graph's
        filler, castcore.simulation.overheads): what ``self`` gives those batches one by one, without building
        them. None where only the batches can say (pipeline stages, an attention priced per call or over a
        window)."""
        decoding = [
            k
            for k in (k.decodes if isinstance(k, attention_pricing.SplitKernel) else k for k in self._kernels)
            if isinstance(k, attention_pricing.LinearKernel) and k.plain
        ]
        if self.stages is not None or len(decoding) < len(self._kernels):
            return None
        n, total = len(cached), sum(cached)
        self.stage_times(
            [*(Chunk(1, c) for c in cached), *[Chunk(1, 0, False)] * idle]
        )  # body and head, kept
        fixed = self._body[n + idle][0] + self._head[n][0]
        # Each kernel's compute, memory and rest are lines in the run's keys (features: 1, sequences, keys, kept
        # pairs, sequences; a decode's kept pairs are its keys): (at no keys, per key) for each.
        rows = n + idle
        lines = [
            (counts[0], *((a[0] + (a[1] + a[4]) * rows, a[2] + a[3]) for a in (k.compute, k.memory, k.rest)))
            for (counts, _), k in zip(self.attention, decoding)
        ]
        return [
            fixed
            + sum(
                c * (max(ca + cb * x, ma + mb * x) + ra + rb * x) for c, (ca, cb), (ma, mb), (ra, rb) in lines
            )
            for x in (float(total + n * j + idle) for j in range(1, steps + 1))
        ]

    def __call__(self, chunks: Sequence[Chunk | tuple]) -> float:
        """The iteration's seconds; under ``--pp`` the period of one micro-batch among ``pp`` in flight (Stages)."""
        times = self.stage_times(chunks)
        if self.stages is None:
            return times[0]
        return self.stages.period(
            times,
            sum(c[0] if isinstance(c, tuple) else c.new for c in chunks),
            self.profile,
            self.pipeline.host.resolver,
        )

    def attention_kernels(self, chunks: Sequence[Chunk]) -> list[float]:
        """castcore's estimate of the iteration's attention kernel of each layer kind."""
        return [price(chunks) for price in self._kernels]

    def _pricing(self, template: OpInvoke, max_tokens: int):
        """How a layer kind's kernel is priced: the line through the estimator's answers where it is one
        (castcore.serving.attention_pricing), else the plugins asked every iteration."""
        resolver = self.pipeline.host.resolver

        def ask(chunks: Sequence[Chunk]) -> Any:
            return resolver.estimate(attention_call(template, chunks), self.profile)

        def parts(chunks: Sequence[Chunk]) -> tuple[float, float, float, float]:
            e = ask(chunks)
            return e.time_s, e.compute_s, e.memory_s, e.overhead_s + e.comm_s

        if template.name in SPLIT:
            return attention_pricing.fit_split(parts, max_tokens)
        options = (template.argument("causal"), template.argument("window"), template.argument("chunk"))
        line = attention_pricing.fit(parts, options, max_tokens)
        return line if line is not None else (lambda chunks: ask(chunks).time_s)

    def attention_time(self, chunks: Sequence[Chunk]) -> float:
        """castcore's estimate of the iteration's attention kernels (one per layer)."""
        return sum(sum(counts) * k for (counts, _), k in zip(self.attention, self.attention_kernels(chunks)))


@dataclass
class Stages:
    """Pipeline stages in a continuous-batching engine: the whole model's ops split into ``pp`` stages as
    castcore.deploy.parallel.pipeline_stages splits them (its layers, the embedding with the first, the LM head with the last),
    ``pp`` micro-batches in flight. A micro-batch's period is ``pp`` times its slowest stage, and at least one pass
    through every stage with the ``pp - 1`` activation sends between them."""

    prefix: str
    counts: list[int]
    activation_bytes: int  # one token's activation sent between stages
    devices: int

    @classmethod
    def of(cls, base: Workload) -> Stages:
        from castcore.devices.dtypes import torch_dtype
        from castcore.deploy.pipeline import build
        from castcore.deploy.parallel.pipeline_stages import check_stages, stage_layers

        built = build(replace(base, pp=1, batch=1, seq=8, phase="prefill", kv_len=None))
        path, layers = check_stages(built.model, base.pp)
        hidden = int(getattr(built.config, "hidden_size", None) or getattr(built.config, "n_embd", 0) or 0)
        return cls(
            prefix=f"{type(built.model).__name__}.{path}",
            counts=stage_layers(layers, base.pp),
            activation_bytes=hidden * torch_dtype(base.dtype).itemsize,
            devices=max(base.tp, base.ep) * base.pp,
        )

    def assign(self, report: Report) -> list[int]:
        from castcore.deploy.parallel.pipeline_stages import assign

        return assign([r.invoke.module for r in report.records], self.prefix, self.counts)

    def period(self, times: list[float], tokens: int, profile: DeviceProfile, resolver: Any = None) -> float:
        """``resolver`` (the plugin host's) answers the sends between stages (castcore::send); None: the core."""
        from castcore.deploy.parallel.pipeline_stages import transfer_time

        send, _ = transfer_time(tokens * self.activation_bytes, profile, self.devices, resolver=resolver)
        return max(len(times) * max(times), sum(times) + (len(times) - 1) * send)


def random_batches(
    count: int,
    seed: int = 0,
    *,
    sequences: int = 40,
    kv: tuple[int, int] = (1, 200),
    chunk: tuple[int, int] = (2, 200),
    chunk_cached: tuple[int, int] = (0, 50),
) -> list[list[Chunk]]:
    """Mixed batches to check the model with: up to ``sequences`` decode tokens at KV lengths in ``kv``, and in
    most batches a prompt chunk (``chunk`` tokens over ``chunk_cached``), sampling or not."""
    rng = random.Random(seed)
    batches = []
    for _ in range(count):
        chunks = [Chunk(1, rng.randint(*kv)) for _ in range(rng.randint(1, sequences))]
        if rng.random() < 0.7:
            chunks.append(Chunk(rng.randint(*chunk), rng.randint(*chunk_cached), samples=rng.random() < 0.5))
        batches.append(chunks)
    return batches


def agreement(model: StepTimes, batches: Sequence[Sequence[Chunk]]) -> list[dict[str, Any]]:
    """Each batch's time by ``model`` and by a direct capture of it, and the relative difference."""
    rows = []
    for chunks in batches:
        direct = capture_mixed(model.pipeline, model.base, chunks, model.profile).time_s
        fast = model(chunks)
        rows.append(
            {
                "sequences": len(chunks),
                "tokens": sum(c.new for c in chunks),
                "kv_tokens": sum(c.cached for c in chunks),
                "direct_s": direct,
                "model_s": fast,
                "error": fast / direct - 1,
            }
        )
    return rows
