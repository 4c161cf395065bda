"""castcore: how fast a PyTorch model or operator runs on an accelerator you may not have.

The embedder's face. ``castcore.estimate(castcore.build_workload("llama-3-8b"), device="...")``
returns the Report ``castcore estimate`` prints; ``castcore.estimate(model, input_ids)`` does the
same for a model you built; ``castcore.serve("llama-3-70b", batch=32, tp=8)`` the ServeReport ``castcore serve``
prints; ``castcore.sweep({"command": "estimate", "model": [...], "device": [...]})`` the rows ``castcore sweep``
writes, ``castcore.plan("llama-3-8b", ttft="1s")`` the deployments ``castcore plan`` prints. Pack and custom-op
authors import ``castcore.pack`` instead.

Names load on first use, so ``import castcore`` (and ``castcore --help``) does not import torch.

The package is in layers, each importing only those below it (the import contract in pyproject.toml, imports
for type checking included), and no module inside imports this face or ``castcore.pack``. From the top: cli;
sweeps, and beside it optools (partition, measure, calibrate, measure_table: tools that take a session);
workload (Workload, the pipeline, serving, Session); report; builtin (the core's own plugin); ops (register_op
and measured tables, as a pack author defines them); plugins (hooks, loading, the plugin host, the audit);
recording; hf; options; devices; tomlfiles; errors.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> the module that defines it
_EXPORTS = {
    "Session": "castcore.session",
    "estimate": "castcore.session",
    "default_session": "castcore.session",
    "serve": "castcore.session",
    "simulate": "castcore.session",
    "SimulationReport": "castcore.serving.traffic",
    "ServeReport": "castcore.serving.static",
    "build_workload": "castcore.workload.spec",
    "Workload": "castcore.workload.spec",
    "Report": "castcore.report.records",
    "OpRecord": "castcore.report.records",
    "MemoryReport": "castcore.report.memory",
    "DeviceProfile": "castcore.devices.profile",
    "Interconnect": "castcore.devices.profile",
    "load_device_file": "castcore.devices.profile_files",
    "device_from_dict": "castcore.devices.profile_files",
    "Config": "castcore.plugins.config",
    "load_config": "castcore.plugins.config",
    "capture": "castcore.recording.recorder",
    "Capture": "castcore.recording.recorder",
    "register_op": "castcore.ops.register",
    "partition": "castcore.operator_tools.partition",
    "measure": "castcore.operator_tools.timing",
    "calibrate": "castcore.operator_tools.timing",
    "measure_table": "castcore.operator_tools.measured_tables",
    "sweep": "castcore.sweeps.sweep",
    "SweepResult": "castcore.sweeps.run",
    "plan": "castcore.sweeps.plan",
    "PlanResult": "castcore.sweeps.plan",
    "write_html": "castcore.report.html.write",
    "PluginOptions": "castcore.plugins.selection",
    "StrictFailure": "castcore.errors",
    # the error types
    "CastcoreError": "castcore.errors",
    "CaptureError": "castcore.recording.recorder",
    "ConfigError": "castcore.plugins.config",
    "DeviceError": "castcore.devices.profile",
    "EstimatorError": "castcore.plugins.resolve",
    "ModelError": "castcore.workload.spec",
    "CustomOpError": "castcore.ops.annotations",
    "AnnotationError": "castcore.ops.annotations",
    "PartitionError": "castcore.operator_tools.partition",
    "MeasureError": "castcore.operator_tools.timing",
    "MeasuredTableError": "castcore.ops.tables",
}
# What a pack or custom-op file uses is castcore.pack's; these few are here too so files written for
# the seed RFC (``castcore.register_op_estimator``, ``castcore.OpInvokeInfo``, ``castcore.PerformanceModel``)
# run with only their import lines changed.
_PACK_NAMES = (
    "hookimpl",
    "register_op_estimator",
    "register_op_properties",
    "Estimate",
    "PerformanceProperties",
    "ComputeOps",
    "OpInvoke",
    "TensorMeta",
    "register_measured_table",
    "OpInvokeInfo",
    "PerformanceModel",
)

__all__ = [
    "AnnotationError",
    "Capture",
    "CaptureError",
    "CastcoreError",
    "ComputeOps",
    "Config",
    "ConfigError",
    "CustomOpError",
    "DeviceError",
    "DeviceProfile",
    "Estimate",
    "EstimatorError",
    "Interconnect",
    "MeasureError",
    "MeasuredTableError",
    "MemoryReport",
    "ModelError",
    "OpInvoke",
    "OpInvokeInfo",
    "OpRecord",
    "PartitionError",
    "PerformanceModel",
    "PerformanceProperties",
    "PlanResult",
    "PluginOptions",
    "Report",
    "ServeReport",
    "Session",
    "SimulationReport",
    "StrictFailure",
    "SweepResult",
    "TensorMeta",
    "Workload",
    "__version__",
    "build_workload",
    "calibrate",
    "capture",
    "default_session",
    "device_from_dict",
    "estimate",
    "hookimpl",
    "load_config",
    "load_device_file",
    "measure",
    "measure_table",
    "partition",
    "plan",
    "register_measured_table",
    "register_op",
    "register_op_estimator",
    "register_op_properties",
    "serve",
    "simulate",
    "sweep",
    "write_html",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _PACK_NAMES:
        value = getattr(importlib.import_module("castcore.pack"), name)
    elif name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("castcore")
        except PackageNotFoundError:
            value = "unknown"
    else:
        raise AttributeError(f"module 'castcore' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from castcore.devices.profile import DeviceError, DeviceProfile, Interconnect
    from castcore.devices.profile_files import device_from_dict, load_device_file
    from castcore.errors import CastcoreError, StrictFailure
    from castcore.ops.annotations import AnnotationError, CustomOpError
    from castcore.ops.register import register_op
    from castcore.ops.tables import MeasuredTableError
    from castcore.operator_tools.measured_tables import measure_table
    from castcore.operator_tools.partition import PartitionError, partition
    from castcore.operator_tools.timing import MeasureError, calibrate, measure
    from castcore.pack import (
        ComputeOps,
        Estimate,
        OpInvoke,
        OpInvokeInfo,
        PerformanceModel,
        PerformanceProperties,
        TensorMeta,
        hookimpl,
        register_measured_table,
        register_op_estimator,
        register_op_properties,
    )
    from castcore.plugins.config import Config, ConfigError, load_config
    from castcore.plugins.resolve import EstimatorError
    from castcore.plugins.selection import PluginOptions
    from castcore.recording.recorder import Capture, CaptureError, capture
    from castcore.report.memory import MemoryReport
    from castcore.report.html.write import write_html
    from castcore.report.records import OpRecord, Report
    from castcore.sweeps.plan import PlanResult, plan
    from castcore.sweeps.run import SweepResult
    from castcore.sweeps.sweep import sweep
    from castcore.serving.serve_report import ServeReport
    from castcore.session import Session, default_session, estimate, serve, simulate
    from castcore.serving.simulation_report import SimulationReport
    from castcore.workload.spec import ModelError, Workload, build_workload

    __version__: str
