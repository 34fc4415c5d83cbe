"""An optional price table per model: tokens into cost."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from recovery_ext._errors import ConfigurationError

PER = 1_000_000  # prices are quoted per million tokens, as providers publish them
# One currency unit per token: far above any real price, and a cost of the most tokens a call may record
# stays a finite number (a price of 1e308 made every cost infinite and every call unrecordable).
MAX_PRICE = 1_000_000.0


@dataclass(frozen=True)
class Prices:
    """``{model: {"input": price, "output": price}}`` per million tokens, in any one currency.

    ``Prices.parse({"gpt-4o-mini": {"input": 0.15, "output": 0.6}})``; a model not in the table has
    no cost (None), so a call is never priced by guess.
    """

    table: Mapping[str, tuple[float, float]]

    @classmethod
    def parse(cls, table: Mapping[str, Any] | None) -> Prices:
        parsed: dict[str, tuple[float, float]] = {}
        for model, price in (table or {}).items():
            if not isinstance(price, Mapping) or set(price) - {"input", "output"}:
                raise ConfigurationError(f"the price of model {model!r} must be {{'input': ..., 'output': ...}} per "
                                         f"million tokens, got {price!r}")
            values = []
            for side in ("input", "output"):
                value = price.get(side, 0.0)
                # compared, not converted: NaN and infinities fail the range, and so does an int beyond floats
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_PRICE:
                    raise ConfigurationError(f"the {side} price of model {model!r} must be a number from 0 to "
                                             f"{MAX_PRICE:g} per million tokens, got {value!r}")
                values.append(float(value))
            parsed[str(model)] = (values[0], values[1])
        return cls(parsed)

    def cost(self, model: str | None, tokens_in: int, tokens_out: int) -> float | None:
        price = self.table.get(model or "")
        if price is None:
            return None
        cost = (tokens_in * price[0] + tokens_out * price[1]) / PER
        return cost if math.isfinite(cost) else None

    def most(self, model: str | None, tokens: int) -> float | None:
        """The most ``tokens`` of ``model`` can cost, split between prompt and answer in any way: every token at
        the dearer of its two prices (what a spend cap reserves before the call); None: the model has no price."""
        price = self.table.get(model or "")
        if price is None:
            return None
        cost = tokens * max(price) / PER
        return cost if math.isfinite(cost) else None
