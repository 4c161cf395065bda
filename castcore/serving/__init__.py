"""What a deployment delivers: a static batch, traffic through the engine, disaggregated pools, speculation, KV capacity, the step-time model and metering."""
