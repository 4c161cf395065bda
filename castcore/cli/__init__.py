"""The ``castcore`` command: one module per subcommand; each parses its options into library calls."""
