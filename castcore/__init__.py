"""castcore: estimate PyTorch operator and model cost on accelerators from fake-tensor captures.

The public, embeddable API. Packs use ``hookimpl``, ``register_op_estimator`` and
``register_op_properties``; tools use ``estimate`` and ``Session``.
"""

from __future__ import annotations

from .annotations import AnnotationError, CustomOpError
from .capture import Capture, CaptureError, capture
from .claims import register_op_estimator, register_op_properties
from .config import Config, ConfigError, load_config
from .devices import DeviceError, DeviceProfile, Interconnect, device_from_dict, load_device_file, package_profiles
from .estimate import Estimate, EstimatorError, Source
from .hookspecs import hookimpl
from .invoke import OpInvoke, TensorMeta
from .measure import MeasureError, MeasureReport, Measurement, calibrate, measure
from .measured import (MeasuredTable, MeasuredTableError, load_measured_table, measure_table,
                       register_measured_table, write_measured_table)
from .memory import MemoryReport, analyze_memory, kv_cache_bytes
from .models import Workload, build_workload
from .properties import ComputeOps, PerformanceProperties
from .partition import Collective, PartitionError, PartitionPlan, Split, partition
from .register import RegisteredOp, register_op
from .report import OpRecord, OpSummary, Report
from .session import Session, default_session, estimate

__all__ = [
    "AnnotationError", "Capture", "CaptureError", "Collective", "ComputeOps", "Config", "ConfigError",
    "CustomOpError", "DeviceError", "DeviceProfile", "Estimate", "EstimatorError", "Interconnect", "MeasureError",
    "MeasureReport", "MeasuredTable", "MeasuredTableError", "Measurement", "MemoryReport", "OpInvoke", "OpRecord",
    "OpSummary", "PartitionError", "PartitionPlan", "PerformanceProperties", "RegisteredOp", "Report", "Session",
    "Source", "Split", "TensorMeta", "Workload", "analyze_memory", "build_workload", "calibrate", "capture",
    "default_session", "device_from_dict", "estimate", "hookimpl", "kv_cache_bytes", "load_config",
    "load_device_file", "load_measured_table", "measure", "measure_table", "package_profiles", "partition",
    "register_measured_table", "register_op", "register_op_estimator", "register_op_properties",
    "write_measured_table",
]
