"""Reports: per-call estimates with totals, memory liveness, and their table, JSON, CSV, trace and chart forms."""
