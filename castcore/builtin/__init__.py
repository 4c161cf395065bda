"""The core's own plugin: aten formulas, the roofline estimator, the point-to-point send and the memory-only fallback.

Both hook implementations are ``trylast``: every pack and user file is asked first.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from castcore.builtin import formulas
from castcore.devices.costs import STEP_FALLBACK, Source
from castcore.devices.memory_kernels import memory_family
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
            props, source = invoke.memory_access_properties(), Source(CORE_NAME, STEP_FALLBACK)
        family = memory_family(invoke.name)
        if (
            family and not props.kernel
        ):  # priced at its family's bandwidth and floor where the profile has them
            props = replace(props, kernel=family)
        return roofline(props, device, source)

    @hookimpl(trylast=True)
    def op_properties(self, invoke, device):
        claim = self.find("properties", invoke.op, device.name)
        if claim is not None:
            return claim.fn(invoke, device)
        return formulas.by_tag(invoke)
