"""What to estimate: the Workload and its checks (spec), the model sources (shipped presets, config.json files,
factories, a user's own transformers model), the quantization a checkpoint ships with, and built-in draft heads."""
