"""Request-level simulation of a serving deployment under traffic (``castcore simulate``).

- ``lengths``: token-length distributions (fixed, uniform, normal, lognormal), parsed from text, seeded.
- ``requests``: the requests to serve, drawn from length distributions or read from a JSONL trace.
- ``arrivals``: when requests arrive: all at once, at a rate (Poisson or gamma, as ``vllm bench serve``), or a
  closed loop of fixed concurrency.
- ``engine``: a continuous-batching engine over KV blocks, with each engine's documented defaults (``presets``).
- ``metrics``: per-request results summed up under ``vllm bench serve --save-result``'s field names, and a table.
"""
