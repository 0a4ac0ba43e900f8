"""Score runs of a graph with @reward functions and a group-relative judge, offline.

    OMP_NUM_THREADS=1 python examples/rewards_and_judge.py

The judge here is a scripted stand-in so the example runs without network; use any LangChain chat model
instead, e.g. RulerJudge(ChatOpenAI(model="gpt-4.1")).
"""

from __future__ import annotations

import json

from langchain_core.language_models import FakeListChatModel
from langgraph.graph import START, MessagesState, StateGraph

import langgraph_art as art


def build_graph(llm: art.ChatART):
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [llm.invoke(state["messages"])]})
    graph.add_edge(START, "agent")
    return graph.compile()


@art.reward
def mentions_a_digit(state) -> float:
    """1 when the final answer contains a digit."""
    return float(any(ch.isdigit() for ch in state["messages"][-1].content))


@art.reward(name="brevity", weight=0.5)
def brevity(trajectory) -> dict[str, float]:
    """Sub-scores: shorter answers, fewer model calls."""
    tokens = sum(len(t.token_ids) for t in trajectory.turns())
    return {"tokens": max(0.0, 1 - tokens / 24), "calls": 1.0 / len(trajectory.turns())}


def main() -> None:
    with art.LocalBackend(home=".art-example") as backend:
        model = art.TrainableModel(name="example-agent", project="example").register(backend)
        graph = build_graph(art.ChatART(model=model, max_tokens=16))
        scenarios = [{"id": "q1", "input": {"messages": [("user", "Give me a number")]}}]
        groups = art.gather_groups(graph, scenarios, num_generations=4, progress=False)

        scripted = json.dumps(
            {"scores": [{"trajectory_id": f"t{i + 1}", "explanation": "ok", "score": i / 3} for i in range(4)]}
        )
        judge = art.RulerJudge(FakeListChatModel(responses=[scripted]), cache=False)
        report = art.score_groups(groups, [mentions_a_digit, brevity, judge])
        for trajectory in groups[0].trajectories:
            print(f"{trajectory.reward:.3f}", trajectory.rewards, trajectory.explanations.get("ruler"))
        print({k: round(v, 3) for k, v in report.metrics.items()})


if __name__ == "__main__":
    main()
