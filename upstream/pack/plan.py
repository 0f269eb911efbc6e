"""Sizing a pack before building it (InstCache): the size follows N = a(e^(b sigma) - 1),
fitted from the sizes of two searches at small sigmas; the hit rate a budget sigma buys
is the share of validation instructions whose NLL is within it (the empirical CDF)."""

import math
from dataclasses import dataclass

import numpy as np
from meancache.shared.errors import PackError
from scipy.optimize import brentq


@dataclass(frozen=True)
class SizeModel:
    a: float
    b: float

    def size(self, sigma: float) -> float:
        return self.a * math.expm1(self.b * sigma)

    @classmethod
    def fit(cls, sigma1: float, n1: int, sigma2: float, n2: int) -> "SizeModel":
        """Through (sigma1, n1) and (sigma2, n2) exactly, with 0 < sigma1 < sigma2."""
        if not (0 < sigma1 < sigma2 and 0 < n1 < n2):
            raise PackError(f"fitting N = a(e^(b sigma) - 1) needs two searches with "
                            f"0 < sigma1 < sigma2 and 0 < N1 < N2; got N({sigma1:g}) = {n1}, "
                            f"N({sigma2:g}) = {n2}: search at larger sigmas")
        target = n2 / n1
        # The ratio (e^(b s2) - 1) / (e^(b s1) - 1) grows from s2/s1 (b -> 0) without bound.
        if target <= sigma2 / sigma1:
            b = 1e-9  # the size grows no faster than linearly: nearly a straight line
        else:
            def gap(b: float) -> float:
                return math.log(math.expm1(b * sigma2)) - math.log(math.expm1(b * sigma1)) \
                    - math.log(target)
            high = 1.0
            while gap(high) < 0:
                high *= 2
            b = brentq(gap, 1e-12, high)
        return cls(n1 / math.expm1(b * sigma1), b)


def predicted_hit_rate(nlls: list[float], sigma: float) -> float:
    """The share of (validation) instructions a search with budget sigma would emit."""
    return float(np.mean(np.asarray(nlls) <= sigma)) if nlls else 0.0


def sigma_for_hit_rate(nlls: list[float], hit_rate: float) -> float:
    """The smallest sigma whose predicted hit rate reaches ``hit_rate``."""
    finite = np.sort(np.asarray([n for n in nlls if math.isfinite(n)]))
    needed = math.ceil(hit_rate * len(nlls))
    if not 0 < hit_rate <= 1 or needed > len(finite):
        raise PackError(f"a hit rate of {hit_rate:.1%} is out of reach: at most "
                        f"{len(finite) / max(len(nlls), 1):.1%} of validation instructions "
                        "fit the maximum depth")
    return float(finite[needed - 1])
