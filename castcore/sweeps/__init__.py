"""Design-space sweeps: a grid of ``castcore estimate`` or ``castcore serve`` points run on local processes or
Ray tasks, one row per point, with each capture made once and kept on disk (``castcore sweep``, ``castcore
plan``, ``castcore cache``).

- sweep: ``castcore.sweep``, the library function ``castcore sweep`` prints the result of;
- spec: a TOML spec or a dict -> checked axes -> the points of their product (torch-free);
- run: points grouped by the captures they share, handed to a backend (local, ray_backend), rows back in order;
- work: what a worker does with a task; capture and store: the capture cache, in memory and on disk;
- rows, files: a point's row, and the .parquet / .csv / .jsonl files rows go to (and --resume reads);
- plan: ``castcore.plan``, the deployment search; plot: latency against throughput per device, the Pareto front
  marked.

A sweep's axes are estimate's and serve's options as castcore.options.catalog declares them, checked by the same
checks (``spec.Command``), so a sweep takes exactly the options and values the command does.
"""
