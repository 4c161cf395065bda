"""Custom operators: ``register_op`` with dimension annotations, partitioning, timing on this machine,
and measured tables."""
