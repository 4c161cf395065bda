"""The operators this pack answers for on its devices.

Two ways to answer for an operator; choose per operator:

* ``@pack.register_op_estimator(op, device=...)``: you know the op's *time* better than a
  roofline does: a measured table, a kernel model with tiling, padding or launch effects, a
  fused kernel. Return seconds (a float) or a ``pack.Estimate`` with its parts. An estimator
  is asked before any properties (step 2 of castcore's priority order), so it decides the time.
* ``@pack.register_op_properties(op, device=...)``: you know the op's *work*: matrix-unit
  (``mma``) and vector-unit (``gp``) operations per dtype, and bytes read and written. The core's
  roofline turns that into time with the device profile's rates and efficiencies. Less to
  write, and the same count is right on any device; use it when the roofline is good enough.

``device`` is a device name or glob; ``None`` means every device. Keep claims to this pack's own
devices (``DEVICES`` below) unless you mean to answer for other vendors' devices too: a claim on
every device competes with other packs and ``castcore audit`` shows it as a CONFLICT (pass
``override=True`` if shadowing them is intended).

Each function gets ``invoke`` (``pack.OpInvoke``: ``args``/``kwargs`` with
``pack.TensorMeta`` in place of tensors, ``argument(name)``, ``inputs()``, ``outputs()``,
``memory_access_properties()``) and ``device`` (``pack.DeviceProfile``: ``rate(unit, dtype)``,
``memory_bandwidth``, efficiencies, per-op costs). Return ``None`` to leave a call to the next
plugin. Raising, or answering a negative, NaN or infinite number, stops castcore with this
pack, the function and the op named.
"""

from __future__ import annotations

import math

import torch

from castcore import pack

DEVICES = "{{ cookiecutter.device_name }}*"  # this pack's devices: the profile in profiles/ and any variant named like it

# EXAMPLE value, replace: the side of the square blocks the matrix unit works on.
TILE = 16


@pack.register_op_estimator(torch.ops.aten.mm.default, device=DEVICES)
def mm(invoke: pack.OpInvoke, device: pack.DeviceProfile) -> pack.Estimate:
    """EXAMPLE estimator, replace with your device's model: aten.mm with its sizes padded to whole tiles.

    A roofline counts 2*M*N*K operations; a matrix unit that works on TILE x TILE blocks also
    spends time on the padding, which is what an estimator can say and properties cannot.
    """
    a, b = invoke.args  # TensorMeta: shape, dtype, numel(), nbytes
    (m, k), n = a.shape, b.shape[1]
    padded = [math.ceil(size / TILE) * TILE for size in (m, n, k)]
    peak, _ = device.rate("mma", a.dtype)  # op/s of the matrix unit for this dtype (from the profile)
    compute_s = 2 * math.prod(padded) / (peak * device.compute_efficiency)
    moved = sum(t.nbytes for t in invoke.inputs() + invoke.outputs())
    memory_s = moved / (device.memory_bandwidth * device.memory_efficiency)
    return pack.Estimate(
        time_s=max(compute_s, memory_s) + device.mma_op_cost_s,
        compute_s=compute_s, memory_s=memory_s, overhead_s=device.mma_op_cost_s,
        bound="compute" if compute_s >= memory_s else "memory",
        detail={"padded_mnk": padded},  # free-form: shown in JSON reports
    )


@pack.register_op_properties(torch.ops.aten.cumsum.default, device=DEVICES)
def cumsum(invoke: pack.OpInvoke, device: pack.DeviceProfile) -> pack.PerformanceProperties | None:
    """EXAMPLE properties, replace: a cumulative sum of floats done on the matrix unit, as some NPUs do it.

    castcore's core counts a scan as one vector add per element. A device that instead multiplies
    each block of TILE elements by a TILE x TILE triangular matrix of ones does 2*TILE matrix-unit
    ops per element. Only the work differs, so properties are enough: the roofline turns them into
    time with this device's mma rate, and on this pack's devices they are used instead of the core's.
    """
    x = invoke.args[0]
    if not x.dtype.is_floating_point:
        # A scan of a bool mask or of integer positions (every Llama's position ids) has no matrix-unit rate
        # here: None leaves it to the core's vector adds.
        return None
    # Every input read once, every output written once; then the work, counted in the input's dtype.
    return invoke.memory_access_properties().add(x.dtype, mma=2 * TILE * x.numel())
