"""Request-level simulation of a serving deployment under traffic (``castcore simulate``).

- ``lengths``: token-length distributions (fixed, uniform, normal, lognormal), parsed from text, seeded.
- ``requests``: the requests to serve, drawn from length distributions or read from a JSONL trace.
- ``arrivals``: when requests arrive: all at once, at a rate (Poisson or gamma, as ``vllm bench serve``), or a
  closed loop of fixed concurrency.
- ``engine``: a continuous-batching engine's run loop over its parts: ``request_state`` (each request's status and
  progress), ``blocks`` (the KV block pool), ``scheduler`` (each iteration's ``Batch`` of ``chunks``), ``policies``
  (KV reserve, multi-step decisions, prefix cache, speculation, entry), chosen from each engine's documented
  defaults (``presets``).
- ``metrics``: per-request results summed up under ``vllm bench serve --save-result``'s field names, and a table.
"""
