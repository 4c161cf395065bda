"""The pack author's face: everything a pack or a custom-op file needs, and nothing else of castcore.

A pack imports only this module (a test fails otherwise), so castcore's internals can move freely.
"""

from __future__ import annotations

from castcore.builtin import formulas
from castcore.devices.costs import ComputeOps, Estimate, PerformanceProperties, Source
from castcore.devices.dtypes import dtype_name
from castcore.devices.profile import DeviceProfile, Interconnect
from castcore.devices.profile_files import device_from_dict, package_profiles
from castcore.devices.roofline import roofline
from castcore.devices.tiles import tiled_matmul
from castcore.ops.register import register_op
from castcore.ops.tables import register_measured_table
from castcore.plugins.claims import register_op_estimator, register_op_properties
from castcore.plugins.hookspecs import hookimpl
from castcore.plugins.replacements import declare_replaces
from castcore.plugins.rfc import OpInvokeInfo, PerformanceModel
from castcore.recording.hints import collective_kernels
from castcore.recording.invoke import OpInvoke, TensorMeta, op_name, tensors_in
from castcore.recording.routing import expert_routing

__all__ = [
    "ComputeOps",
    "DeviceProfile",
    "Estimate",
    "Interconnect",
    "OpInvoke",
    "OpInvokeInfo",
    "PerformanceModel",
    "PerformanceProperties",
    "Source",
    "TensorMeta",
    "collective_kernels",
    "declare_replaces",
    "device_from_dict",
    "dtype_name",
    "expert_routing",
    "formulas",
    "hookimpl",
    "op_name",
    "package_profiles",
    "register_measured_table",
    "register_op",
    "register_op_estimator",
    "register_op_properties",
    "roofline",
    "tensors_in",
    "tiled_matmul",
]
