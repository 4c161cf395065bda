"""castcore pack for the {{ cookiecutter.device_name }} ({{ cookiecutter.vendor }}).

castcore imports this module through the entry point in pyproject.toml. Everything declared
while it is imported belongs to this pack: any ``@pack.hookimpl`` functions here{% if cookiecutter.estimators == "yes" %}, and the
``register_op_estimator`` / ``register_op_properties`` claims in ``ops.py`` (imported below){% else %}. It declares
none: a pack of device profiles only, whose operators castcore's own formulas and roofline price{% endif %}.
The device profiles in ``profiles/`` are read as data through the ``castcore.profiles`` entry point.
"""

from __future__ import annotations

from . import ops  # noqa: F401  (importing ops declares its estimators and properties)

PACK = "{{ cookiecutter.pack_name }}"
DEVICE = "{{ cookiecutter.device_name }}"
