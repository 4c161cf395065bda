"""castcore's fidelity report: estimates against published measurements and against this machine.

``python bench/fidelity/run.py`` (``nox -s fidelity``) runs it; see run.py. The modules import one another as
``fidelity.*`` with bench/ on the path, as run.py and tests/devices/test_fidelity.py set it.
"""
