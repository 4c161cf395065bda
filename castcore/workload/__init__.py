"""Workloads: what to estimate (model, shapes, phase, parallelism, fusion), the one pipeline that turns a
Workload into captures and a Report (with a plugin host and the capture step it is given), serving figures
built on it, and the Session: a plugin host with that pipeline, the embedded API's centre."""
