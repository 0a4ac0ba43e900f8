"""A router node that answers in structured output, trained by GRPO under the grammar that enforces it.

The graph is one node, ``route``, whose LLM is ``ChatART(...).with_structured_output(Route)``: LangChain's default
method, a JSON-schema response format. ``Route`` is ``{"destination": "weather" | "math" | "search" | "chat",
"note": <at most 12 characters>}``. The service decodes under the schema's grammar, so every answer parses, even on
the random-init tiny model, which never writes JSON by itself; training then teaches the choice: a question's topic
fixes the right destination, reward 1 for it, 0 otherwise. Held out: a third question per topic.

The trainer recomputes each token's logprob under the mask it was sampled with (``constrained_logprobs="masked"``,
the default); ``--constrained-logprobs unmasked`` trains on the whole vocabulary's logprobs instead, to compare
(``benchmarks/constrained_training.py`` runs both).

Offline, tiny model:
    OMP_NUM_THREADS=1 python examples/router.py --steps 40
On a real model (GPU):
    python examples/router.py --base-model Qwen/Qwen2.5-1.5B-Instruct --learning-rate 1e-5 --temperature 1.0 \\
        --engine vllm
"""

from __future__ import annotations

from typing import Any, Literal

from harness import grpo_config, parse_args, report, trainable_model, warm_up
from langgraph.graph import START, MessagesState, StateGraph
from pydantic import BaseModel, Field

import langgraph_art as art

TOPICS = {
    "weather": ["what is the weather in paris today", "will it rain in london tomorrow", "weather in tokyo on monday"],
    "math": ["add 12 and 30 please", "what is 7 multiply 6", "divide 90 by 3 and subtract 4"],
    "search": ["find the emails from alice", "search my inbox for the report", "look up the last orders"],
    "chat": ["hello how are you", "thanks that was great", "hi there good morning"],
}


class Route(BaseModel):
    destination: Literal["weather", "math", "search", "chat"]
    note: str = Field(max_length=12)


def scenarios(index: int) -> list[dict[str, Any]]:
    """One question per topic; ``index`` 0 and 1 are trained on, 2 is held out."""
    return [
        {"id": f"{topic}-{index}", "topic": topic, "input": {"messages": [("user", q[index])]}}
        for topic, q in TOPICS.items()
    ]


def build_graph(llm: art.ChatART) -> Any:
    router = llm.with_structured_output(Route, include_raw=True)  # the raw message goes into the state

    def route(state: MessagesState) -> dict[str, Any]:
        return {"messages": [router.invoke(state["messages"])["raw"]]}

    graph = StateGraph(MessagesState)
    graph.add_node("route", route)
    graph.add_edge(START, "route")
    return graph.compile()


@art.reward
def right_destination(state, scenario) -> float:
    """1 for the topic's destination. Parsing cannot fail under the grammar; if it did, the reward would raise."""
    return float(Route.model_validate_json(str(state["messages"][-1].content)).destination == scenario["topic"])


def routed_conversations() -> list[dict[str, Any]]:
    """SFT examples for ``--warmup-steps``: the training questions answered with their route, as JSON."""
    return [
        {"messages": [
            {"role": "user", "content": questions[index]},
            {"role": "assistant", "content": Route(destination=topic, note="ok").model_dump_json()},
        ]}
        for topic, questions in TOPICS.items()
        for index in (0, 1)
    ]  # fmt: skip


def main(argv: list[str] | None = None, *, echo: Any = print) -> dict[str, Any]:
    args = parse_args(
        __doc__ or "",
        argv,
        steps=30,
        warmup_steps=0,
        learning_rate=1e-3,
        temperature=1.0,
        num_generations=16,
        scenarios_per_step=2,
        options=[("--constrained-logprobs", {"default": "masked", "choices": ["masked", "unmasked"]})],
    )
    with trainable_model(args, f"router-{args.constrained_logprobs}-{args.seed}", "examples") as (model, llm):
        trainer = art.Trainer(
            build_graph(llm),
            model,
            rewards=[right_destination],
            num_generations=args.num_generations,
            scenarios_per_step=args.scenarios_per_step,
            config=grpo_config(args, constrained_logprobs=args.constrained_logprobs),
            eval_scenarios=scenarios(2),
            eval_generations=8,
            eval_every=10,
        )
        warm_up(trainer, routed_conversations(), args, echo=echo)
        history = trainer.train(scenarios(0) + scenarios(1), steps=args.steps)
        return report(trainer, history, echo=echo, shown="a routing")


if __name__ == "__main__":
    main()
