"""castcore: estimate PyTorch operator and model cost on accelerators from fake-tensor captures.

The public, embeddable API. Packs use ``hookimpl``, ``register_op_estimator`` and
``register_op_properties``; tools use ``estimate`` and ``Session``.
"""

from __future__ import annotations

from .capture import Capture, CaptureError, capture
from .claims import register_op_estimator, register_op_properties
from .config import Config, ConfigError, load_config
from .devices import DeviceError, DeviceProfile, Interconnect, device_from_dict, load_device_file
from .estimate import Estimate, EstimatorError, Source
from .hookspecs import hookimpl
from .invoke import OpInvoke, TensorMeta
from .memory import MemoryReport, analyze_memory, kv_cache_bytes
from .models import Workload, build_workload
from .properties import ComputeOps, PerformanceProperties
from .report import OpRecord, OpSummary, Report
from .session import Session, default_session, estimate

__all__ = [
    "Capture", "CaptureError", "ComputeOps", "Config", "ConfigError", "DeviceError", "DeviceProfile",
    "Estimate", "EstimatorError", "Interconnect", "OpInvoke", "OpRecord", "OpSummary", "PerformanceProperties",
    "MemoryReport", "Report", "Session", "Source", "TensorMeta", "Workload", "analyze_memory", "build_workload",
    "capture", "default_session", "device_from_dict", "estimate", "hookimpl", "kv_cache_bytes", "load_config",
    "load_device_file", "register_op_estimator", "register_op_properties",
]
