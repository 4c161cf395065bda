"""Recording: run a model on fake tensors and record every operator call (``OpInvoke``), reusing
the records of repeated layers."""
