"""The seed RFC's names for castcore's own, so an estimator file written to it runs once its imports
name castcore (``from castcore import register_op_estimator, PerformanceModel, OpInvokeInfo``).

``register_op_estimator(op, None, True)`` is castcore's own decorator (castcore.plugins.claims), which
takes the RFC's positional form and one-parameter properties functions as they are.
"""

from __future__ import annotations

from castcore.devices.costs import ComputeOps, Estimate, PerformanceProperties
from castcore.plugins.claims import register_op_properties
from castcore.recording.invoke import OpInvoke


class PerformanceModel:
    """Where the RFC's estimators find ``Result``: ``PerformanceModel.Result(seconds)`` is an Estimate."""

    Result = Estimate


class _AnyOpInvoke(type):
    # What an estimator receives is an OpInvoke; the RFC calls it an OpInvokeInfo, so isinstance agrees.
    def __instancecheck__(cls, instance: object) -> bool:
        return isinstance(instance, OpInvoke)


class OpInvokeInfo(OpInvoke, metaclass=_AnyOpInvoke):
    """The RFC's name for an OpInvoke, and the home of its helpers: ``OpInvokeInfo.register_op_properties(op)``
    (decorating ``fn(op_invoke_info)``), ``OpInvokeInfo.PerformanceProperties``, ``OpInvokeInfo.ComputeOps``."""

    __slots__ = ()
    PerformanceProperties = PerformanceProperties
    ComputeOps = ComputeOps
    register_op_properties = staticmethod(register_op_properties)
