"""Workloads: what to estimate (model, shapes, phase, parallelism, fusion), the Session and the one pipeline
that turns a Workload into a Report."""
