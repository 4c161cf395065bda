"""Tools for operators that need a session or this machine: ``partition`` (the legal splits of a registered op
over N devices, estimated), ``measure`` and ``calibrate`` (ops run for real here against their estimates, and a
device profile of this machine), ``measure_table`` (a measured table written from runs here). A public function
takes ``session=None`` for the default session; the functions inside take the session explicitly."""
