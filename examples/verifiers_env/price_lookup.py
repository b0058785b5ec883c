"""A verifiers tool taskset (verifiers 0.4, `import verifiers.v1 as vf`) that lorarl trains on as
`id = "verifiers:examples.verifiers_env.price_lookup"`: what does a small basket cost, when the prices
are only known to a `shop_price` tool? The tool is a `vf.Toolset` of the task (one per rollout) that
records what it was asked in the rollout's state; the task's reward checks the total, its metrics
count the lookups and read that state. Plain verifiers code: `vf-eval` runs the toolset as an MCP
server (`python price_lookup.py` serves it), lorarl calls it in-process.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf
from pydantic import Field

__all__ = ["PriceLookup"]

PRICES = {"apple": 40, "pear": 55, "lemon": 30, "plum": 25, "melon": 180, "mango": 120}
"""Cents per item: the shop's secret, only the tool tells."""


class ShopState(vf.State):
    looked_up: list[str] = Field(default_factory=list)
    """The items the tool was asked about, in order."""


class Shop(vf.Toolset[vf.ToolsetConfig, ShopState]):
    TOOL_PREFIX = "shop"  # the model sees `shop_price`

    @vf.tool
    async def price(self, item: str) -> str:
        """The price of one item, in cents."""
        if item not in PRICES:
            return f"The shop has no {item!r}; it sells {', '.join(PRICES)}."
        self.state.looked_up.append(item)
        return str(PRICES[item])


class BasketData(vf.TaskData):
    basket: dict[str, int]
    """Item -> how many."""
    answer: str
    """The total in cents."""


class BasketTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class BasketTask(vf.Task[BasketData, ShopState, BasketTaskConfig]):
    @classmethod
    def toolsets(cls, config: BasketTaskConfig) -> list[vf.Toolset]:
        return [Shop(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, task: BasketData, trace: vf.Trace) -> float:
        """1 if the last <answer>...</answer> of the reply is the total."""
        answers = re.findall(r"<answer>\s*(.*?)\s*</answer>", trace.last_reply, re.DOTALL)
        return float(bool(answers) and answers[-1] == task.answer)

    @vf.metric
    async def lookups(self, trace: vf.Trace) -> float:
        """Tool results the model got."""
        return float(len(trace.tool_messages))

    @vf.metric
    async def looked_up_all(self, task: BasketData, trace: vf.Trace[BasketData, ShopState]) -> float:
        """1 if the tool was asked about every item of the basket (read from the rollout's state)."""
        return float(set(task.basket) <= set(trace.state.looked_up))


class PriceLookupConfig(vf.TasksetConfig):
    num_tasks: int = 50
    max_items: int = 2
    """Kinds of item in a basket."""
    task: BasketTaskConfig = BasketTaskConfig()


class PriceLookup(vf.Taskset[BasketTask, PriceLookupConfig]):
    def load(self):
        rng = random.Random(0)
        for _ in range(self.config.num_tasks):
            basket = {item: rng.randint(1, 5) for item in rng.sample(sorted(PRICES), self.config.max_items)}
            wanted = " and ".join(f"{n} {item}" for item, n in basket.items())
            data = BasketData(
                prompt=f"What do {wanted} cost in cents? Answer in <answer>...</answer>.",
                system_prompt="Look prices up with the shop_price tool.",
                basket=basket,
                answer=str(sum(PRICES[item] * n for item, n in basket.items())),
            )
            yield BasketTask(data, self.config.task)


if __name__ == "__main__":  # how verifiers launches the tool server
    Shop.run()
