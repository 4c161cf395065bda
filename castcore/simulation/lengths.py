"""Token-length distributions for requests' inputs and outputs, from text (``--input``/``--output``) or Python.

The forms, every draw rounded to a whole number and clamped to at least 1 token:

- ``"512"``: always 512.
- ``"uniform:LOW:HIGH"``: whole numbers in [LOW, HIGH], each equally likely.
- ``"normal:MEAN:STD"``: a normal distribution of mean MEAN and standard deviation STD (0 gives MEAN always).
- ``"lognormal:MEDIAN:SIGMA"``: MEDIAN times e to the power of SIGMA times a standard normal draw, that is the
  lognormal whose underlying normal has mean ln(MEDIAN) and standard deviation SIGMA. The first number is the
  median, not the mean: half the draws fall below it whatever SIGMA is (the mean is MEDIAN * exp(SIGMA**2 / 2)).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from castcore.errors import ModelError

FORMS = "512, uniform:LOW:HIGH, normal:MEAN:STD or lognormal:MEDIAN:SIGMA"
FAMILIES = {"fixed": 1, "uniform": 2, "normal": 2, "lognormal": 2}


def _number(value: float) -> str:
    """A parameter as the user would write it: 512, not 512.0."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _check(family: str, params: tuple[float, ...], text: str) -> None:
    """Refuse impossible parameters with one line naming ``text`` (the distribution as the user gave it)."""

    def refuse(why: str) -> None:
        raise ModelError(f"Token lengths {text!r}: {why}; give {FORMS}, every length at least 1.")

    def whole(value: float, name: str) -> None:
        if not float(value).is_integer() or value < 1:
            refuse(f"{name} must be a whole number of at least 1")

    if family not in FAMILIES or len(params) != FAMILIES[family]:
        refuse("it is not one of the forms")
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) for p in params):
        refuse("its parameters must be finite numbers")
    if family == "fixed":
        whole(params[0], "the length")
    elif family == "uniform":
        whole(params[0], "LOW")
        whole(params[1], "HIGH")
        if params[0] > params[1]:
            refuse("LOW must not exceed HIGH")
    elif family == "normal":
        if params[0] < 1:
            refuse("MEAN must be at least 1")
        if params[1] < 0:
            refuse("STD must not be negative")
    else:
        if params[0] < 1:
            refuse("MEDIAN must be at least 1")
        if params[1] <= 0:
            refuse("SIGMA must be greater than 0")


@dataclass(frozen=True)
class Lengths:
    """A distribution of token counts: ``family`` is one of FAMILIES, ``params`` its numbers in the text's order.

    Build one with ``Lengths.parse("uniform:256:1024")`` or ``Lengths.uniform(256, 1024)``; either way the
    parameters are checked, and impossible ones raise ModelError naming the text and the accepted forms.
    """

    family: str
    params: tuple[float, ...]

    def __post_init__(self) -> None:
        _check(self.family, self.params, str(self))

    def __str__(self) -> str:
        numbers = [_number(p) if isinstance(p, (int, float)) else str(p) for p in self.params]
        return ":".join(numbers) if self.family == "fixed" else ":".join([self.family, *numbers])

    @classmethod
    def parse(cls, text: str | int) -> Lengths:
        """The distribution ``text`` names, in one of the forms of this module's docstring."""
        if isinstance(text, int) and not isinstance(text, bool):
            return cls.fixed(text)
        text = str(text)
        parts = [part.strip() for part in text.strip().split(":")]
        family, fields = ("fixed", parts) if len(parts) == 1 else (parts[0].lower(), parts[1:])
        try:
            params = tuple(float(field) for field in fields)
        except ValueError:
            if family != "fixed" and family in FAMILIES and len(fields) == FAMILIES[family]:
                raise ModelError(
                    f"Token lengths {text!r}: its parameters must be numbers; give {FORMS}, every "
                    "length at least 1."
                ) from None
            params = ()
        _check(family, params, text)
        return cls(family, params)

    @classmethod
    def fixed(cls, length: int) -> Lengths:
        return cls("fixed", (length,))

    @classmethod
    def uniform(cls, low: int, high: int) -> Lengths:
        return cls("uniform", (low, high))

    @classmethod
    def normal(cls, mean: float, std: float) -> Lengths:
        return cls("normal", (mean, std))

    @classmethod
    def lognormal(cls, median: float, sigma: float) -> Lengths:
        return cls("lognormal", (median, sigma))

    def sample(self, rng: random.Random, n: int) -> list[int]:
        """``n`` token counts drawn with ``rng`` (seed it for a reproducible run)."""
        if self.family == "fixed":
            return [int(self.params[0])] * n
        if self.family == "uniform":
            low, high = int(self.params[0]), int(self.params[1])
            return [rng.randint(low, high) for _ in range(n)]
        if self.family == "normal":
            mean, std = self.params
            return [max(1, round(rng.gauss(mean, std))) for _ in range(n)]
        median, sigma = self.params
        return [max(1, round(rng.lognormvariate(math.log(median), sigma))) for _ in range(n)]
