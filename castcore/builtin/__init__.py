"""The core's own plugin: aten formulas, the roofline estimator, the point-to-point send and the memory-only fallback.

Both hook implementations are ``trylast``: every pack and user file is asked first.
"""

from __future__ import annotations

import torch

from castcore.builtin import formulas
from castcore.devices.costs import STEP_FALLBACK, Source
from castcore.devices.roofline import roofline
from castcore.plugins.claims import ESTIMATOR, ClaimTable, claims_of
from castcore.plugins.hookspecs import hookimpl
from castcore.plugins.loading import CORE_NAME


# torch's composite ops that serving engines and torch.compile run as one kernel, whoever calls them: in the
# deployed view a capture records each whole (castcore.recording.whole) and the formulas above price it.
DEPLOYED_WHOLE_OPS = frozenset({torch.ops.aten.rms_norm.default})


class CorePlugin(ClaimTable):
    def __init__(self):
        super().__init__(claims_of(formulas.__name__))
        self.resolver = None  # set by the plugin host (castcore.plugins.host) once the plugin manager exists

    @hookimpl(trylast=True)
    def estimate_op(self, invoke, device):
        claim = self.find(ESTIMATOR, invoke.op, device.name)  # an op the core times outright (castcore::send)
        if claim is not None:
            return claim.answer(invoke, device)
        props, source = self.resolver.properties(invoke, device)
        if props is None:
            return roofline(invoke.memory_access_properties(), device, Source(CORE_NAME, STEP_FALLBACK))
        return roofline(props, device, source)

    @hookimpl(trylast=True)
    def op_properties(self, invoke, device):
        claim = self.find("properties", invoke.op, device.name)
        if claim is not None:
            return claim.fn(invoke, device)
        return formulas.by_tag(invoke)
