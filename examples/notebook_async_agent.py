"""Train LangChain's standard agent (``create_agent``) the way a notebook does: ``await trainer.atrain(...)`` inside
a running event loop. Offline, on the embedded tiny model, a few seconds of CPU.

OMP_NUM_THREADS=1 python examples/notebook_async_agent.py

In Jupyter, drop the ``asyncio.run`` and ``await main()`` in a cell (the cell's loop is already running). The tiny
random-init model learns nothing useful about weather; the point is that nothing in the graph had to change.
"""

from __future__ import annotations

import asyncio
import tempfile

from langchain.agents import create_agent
from langchain_core.tools import tool

import langgraph_art as art


@tool
def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return f"Sunny, 21 C in {city}"


@art.reward
def short_answer(state) -> float:
    """Prefer short final answers (a reward the random tiny model can move)."""
    return 1.0 / (1.0 + len(state["messages"][-1].content))


async def main() -> None:
    with art.LocalBackend(home=tempfile.mkdtemp()) as backend:
        model = art.TrainableModel(name="weather-agent", project="notebook").register(backend)
        llm = art.ChatART(model=model, temperature=2.0, max_tokens=16)
        graph = create_agent(model=llm, tools=[get_weather], system_prompt="Answer briefly.")
        config = art.GRPOConfig(learning_rate=1e-3)
        trainer = art.Trainer(graph, model, rewards=[short_answer], num_generations=8, config=config)
        scenarios = [{"id": "paris", "input": {"messages": [("user", "Weather in Paris?")]}}]
        history = await trainer.atrain(scenarios, steps=3, progress=False)
        for i, m in enumerate(history, 1):
            line = f"iteration {i}: checkpoint {m['step']:.0f}, reward {m['reward/mean']:.3f}"
            print(f"{line}, failed runs {m['runs/failed']:.0f}")


if __name__ == "__main__":
    asyncio.run(main())
