"""Custom operators as a pack or custom-op author defines them: ``register_op`` with dimension annotations (the
record, the torch kernels, the registry) and measured tables declared as estimators. Tools that run or estimate
these ops with a session are castcore.operator_tools'."""
