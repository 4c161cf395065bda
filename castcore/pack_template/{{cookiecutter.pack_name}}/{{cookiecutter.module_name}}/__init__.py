"""castcore pack for the {{ cookiecutter.device_name }} ({{ cookiecutter.vendor }}).

castcore imports this module through the entry point in pyproject.toml. Everything declared
while it is imported belongs to this pack: the ``@castcore.hookimpl`` functions here, and the
``register_op_estimator`` / ``register_op_properties`` claims in ``ops.py`` (imported below).
"""

from __future__ import annotations


import castcore

from . import ops  # noqa: F401  (importing ops declares its estimators and properties)

PACK = "{{ cookiecutter.pack_name }}"
DEVICE = "{{ cookiecutter.device_name }}"


@castcore.hookimpl
def device_profiles() -> list[castcore.DeviceProfile]:
    """Every ``profiles/*.toml`` of this package, validated (a missing source is an error naming the field)."""
    return castcore.package_profiles(__package__, label=PACK)
