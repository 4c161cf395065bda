"""An iteration's attention kernel priced without asking the plugins every iteration, where that gives the same answer.

A simulation asks for one ``castcore::varlen_attention`` kernel per layer kind per iteration, each with its own
lengths: tens of thousands of questions a run, none of them cached (no two iterations are alike), and through the
plugin order they were half of a simulation's time. The core's estimate of that kernel is max(compute, memory) plus
a fixed cost, compute and memory each linear in the batch's sums (new tokens, keys, kept query-key pairs,
sequences). So the kernel is asked at a few probe batches; when a line through those sums reproduces the answer
at other probes exactly, the line prices every iteration. An estimator that is not of that form (a pack's, with
per-sequence tiles) fails the check and is asked every iteration as before: the fast path never changes an answer.

Multi-head latent attention runs two kernels an iteration, its decodes absorbed and its prompt chunks decompressed
(castcore::varlen_latent_attention), and so does linear attention, its decodes recurrent and its prompt chunks
chunked (castcore::varlen_gated_delta_rule; Mamba-2: castcore::varlen_ssd_scan): each is fitted on batches of its
own rows (``SplitKernel``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from castcore.builtin.attention_ops import VERIFY_QUERIES, decodes_and_prompts, kept_keys
from castcore.simulation.chunks import Chunk

FIT_PROBES = 8  # batches the line is fitted on (at least one per feature)
CHECK_PROBES = 6  # further batches it must reproduce
TOLERANCE = 1e-9  # relative: the line is taken only where it is the estimate up to rounding


def features(chunks: Sequence[Chunk], causal: bool, window: int, chunk: int) -> tuple[float, ...]:
    """(1, new tokens, keys, kept (query, key) pairs per head, sequences) of a batch."""
    tokens = keys = pairs = 0
    if causal and not window and not chunk:  # the common case inline: query i of n sees c + i keys
        for n, c, *_ in chunks:
            tokens += n
            keys += c + n
            pairs += n * (2 * c + n + 1) // 2
    else:
        for n, c, *_ in chunks:
            tokens += n
            keys += c + n
            pairs += kept_keys(n, c + n, causal, window, chunk)
    return (1.0, float(tokens), float(keys), float(pairs), float(len(chunks)))


def probe_batches(most_tokens: int, seed: int = 0) -> list[list[Chunk]]:
    """Batches unlike each other in every feature: decodes over short and long caches, a prompt chunk alone, and
    mixes of both, within ``most_tokens`` new tokens."""
    rng = random.Random(seed)
    batches: list[list[Chunk]] = [[Chunk(1, 0)], [Chunk(min(most_tokens, 512), 0)]]
    while len(batches) < FIT_PROBES + CHECK_PROBES:
        decodes = [Chunk(1, rng.randint(1, 32768)) for _ in range(rng.randint(0, min(64, most_tokens - 1)))]
        room = most_tokens - len(decodes)
        prompt = (
            [Chunk(rng.randint(1, room), rng.randint(0, 4096))] if room > 0 and rng.random() < 0.7 else []
        )
        if decodes or prompt:
            batches.append(decodes + prompt)
    return batches


def decode_batches(seed: int = 0) -> list[list[Chunk]]:
    """Batches of decodes only, over caches of unlike lengths, some verifying draft tokens."""
    rng = random.Random(seed)
    return [
        [
            Chunk(rng.choice((1, 1, rng.randint(2, VERIFY_QUERIES))), rng.randint(1, 32768))
            for _ in range(rng.randint(1, 64))
        ]
        for _ in range(FIT_PROBES + CHECK_PROBES)
    ]


def prompt_batches(most_tokens: int, seed: int = 0) -> list[list[Chunk]]:
    """Batches of prompt chunks only (each longer than a decode verifying draft tokens), unlike each other in every
    feature."""
    rng, least = random.Random(seed), VERIFY_QUERIES + 1
    batches: list[list[Chunk]] = []
    while len(batches) < FIT_PROBES + CHECK_PROBES:
        room, chunks = most_tokens, []
        for _ in range(rng.randint(1, 4)):
            if room < least:
                break
            new = rng.randint(least, max(least, min(room, 2048)))
            chunks.append(Chunk(new, rng.randint(0, 4096)))
            room -= new
        if chunks:
            batches.append(chunks)
    return batches


class LinearKernel:
    """``time(chunks)`` = max(compute . f, memory . f) + rest . f over the batch's ``features`` f."""

    def __init__(
        self, compute: list[float], memory: list[float], rest: list[float], options: tuple[bool, int, int]
    ):
        self.compute, self.memory, self.rest, self.options = compute, memory, rest, options
        # A decode's kept pairs are its keys only under a plain causal mask (no window, no chunks).
        self.plain = options[0] and not options[1] and not options[2]

    def __call__(self, chunks: Sequence[Chunk]) -> float:
        return self.at(features(chunks, *self.options))

    def at(self, f: tuple[float, ...]) -> float:
        """The time at features ``f``."""
        compute = sum(a * x for a, x in zip(self.compute, f))
        memory = sum(a * x for a, x in zip(self.memory, f))
        return max(compute, memory) + sum(a * x for a, x in zip(self.rest, f))


Parts = tuple[float, float, float, float]  # (time, compute, memory, rest) of one estimate


class SplitKernel:
    """Two kernels an iteration runs over its own rows each: ``decodes`` over its decode steps, ``prompts`` over
    its prompt chunks (each a LinearKernel, or a function asking the plugins); a kernel with no rows is not run."""

    def __init__(
        self, decodes: Callable[[Sequence[Chunk]], float], prompts: Callable[[Sequence[Chunk]], float]
    ):
        self.decodes, self.prompts = decodes, prompts

    def __call__(self, chunks: Sequence[Chunk]) -> float:
        decodes, prompts = decodes_and_prompts(chunks)
        return (self.decodes(decodes) if decodes else 0.0) + (self.prompts(prompts) if prompts else 0.0)


def fit_split(ask: Callable[[Sequence[Chunk]], Parts], most_tokens: int) -> SplitKernel:
    """Each of the two kernels on its line where it is one, else asked (see SplitKernel)."""
    options = (True, 0, 0)
    decodes = fit(ask, options, most_tokens, decode_batches())
    prompts = fit(ask, options, most_tokens, prompt_batches(most_tokens))
    return SplitKernel(decodes or (lambda chunks: ask(chunks)[0]), prompts or (lambda chunks: ask(chunks)[0]))


def fit(
    ask: Callable[[Sequence[Chunk]], Parts],
    options: tuple[bool, int, int],
    most_tokens: int,
    probes: list[list[Chunk]] | None = None,
) -> LinearKernel | None:
    """The line through ``ask``'s answers at the probe batches (``probe_batches`` unless given), or None when an
    answer is not max(compute, memory) + rest or another probe is off the line."""
    probes = probes or probe_batches(most_tokens)
    answers = [ask(batch) for batch in probes]
    for time_s, compute, memory, rest in answers:
        if not _close(max(compute, memory) + rest, time_s):
            return None
    rows = [features(batch, *options) for batch in probes]
    fitted = [
        _least_squares(rows[:FIT_PROBES], [a[part] for a in answers[:FIT_PROBES]]) for part in (1, 2, 3)
    ]
    on_compute, on_memory, on_rest = fitted
    if on_compute is None or on_memory is None or on_rest is None:
        return None
    kernel = LinearKernel(on_compute, on_memory, on_rest, options)
    if all(_close(kernel(batch), answer[0]) for batch, answer in zip(probes, answers)):
        return kernel
    return None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE * max(abs(a), abs(b)) + 1e-15


def _least_squares(rows: list[tuple[float, ...]], values: list[float]) -> list[float] | None:
    """The coefficients c minimising |rows c - values| (normal equations, Gaussian elimination with pivoting); None
    when the probes do not pin them down."""
    n = len(rows[0])
    # Scale each feature to its largest value so the normal equations stay well conditioned (keys reach 1e6,
    # pairs 1e9).
    scale = [max(abs(r[j]) for r in rows) or 1.0 for j in range(n)]
    scaled = [[r[j] / scale[j] for j in range(n)] for r in rows]
    a = [
        [sum(r[i] * r[j] for r in scaled) for j in range(n)] + [sum(r[i] * v for r, v in zip(scaled, values))]
        for i in range(n)
    ]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col])]
    return [a[i][n] / a[i][i] / scale[i] for i in range(n)]
