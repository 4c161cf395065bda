"""How a workload runs: parallelism, deployed kernels, quantization, and the capture pipeline that applies them."""
