"""Test helpers: a weather tool and an SFT'd LoRA adapter that makes the tiny model a two-step tool agent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

WEATHER_RESULT = "Sunny, 21 C in Paris"
WEATHER_ANSWER = "It is sunny in Paris."
WEATHER_PROMPTS = ["What is the weather in Paris?", "Weather in Paris please", "Is it raining in Paris today?"]
WEATHER_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@tool
def get_weather(city: str) -> str:
    """Get the weather for a city."""
    return WEATHER_RESULT if city == "Paris" else f"No data for {city}"


WEATHER_TOOL: dict[str, Any] = convert_to_openai_tool(get_weather)


def weather_conversations() -> list[tuple[list[dict[str, Any]], str]]:
    """(messages, answer) pairs: a question gets the tool call; question + tool result gets the final answer."""
    pairs = []
    for i, prompt in enumerate(WEATHER_PROMPTS):
        question = [{"role": "user", "content": prompt}]
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
        }
        answered = [
            *question,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": WEATHER_RESULT},
        ]
        pairs += [(question, WEATHER_CALL), (answered, WEATHER_ANSWER)]
    return pairs


def train_tool_call_adapter(model_path: Path, out: Path, max_steps: int = 300, seed: int = 0) -> Path:
    """SFT a LoRA adapter so that, greedily, the tiny model calls get_weather and then answers from the result.

    Prompts are rendered exactly as the server renders them (same tool JSON), so the adapter sees at run time
    the very prompts it was trained on.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from langgraph_art.serve.chat import render_prompt
    from langgraph_art.serve.protocol import Tool

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    tools = [Tool.model_validate(WEATHER_TOOL).model_dump(exclude_none=True)]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    batch = [
        (render_prompt(tok, messages, tools), [*tok.encode(answer), end])
        for messages, answer in weather_conversations()
    ]
    optim = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    peft_model.train()
    for steps in range(1, max_steps + 1):  # noqa: B007 - reported below
        loss = torch.zeros(())
        for prompt_ids, target_ids in batch:  # per-example means (a padded batch converged far slower here)
            ids = torch.tensor([prompt_ids + target_ids])
            labels = torch.tensor([[-100] * len(prompt_ids) + target_ids])
            loss = loss + peft_model(input_ids=ids, labels=labels).loss / len(batch)
        optim.zero_grad()
        loss.backward()
        optim.step()
        if loss.item() < 0.005:
            break
    peft_model.save_pretrained(out)
    (out / "train_info.json").write_text(json.dumps({"final_loss": loss.item(), "steps": steps}))
    return out


def tool_loop_graph(llm: Any) -> Any:
    """agent (ChatART with the weather tool) <-> tools, until the agent answers without a tool call."""
    from langgraph_art.demo import tool_loop

    return tool_loop(llm.bind_tools([get_weather]), [get_weather])


def one_agent_graph(llm: Any) -> Any:
    """The smallest agent: one node that answers with one call of ``llm``."""
    from langgraph.graph import START, MessagesState, StateGraph

    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [llm.invoke(state["messages"])]})
    graph.add_edge(START, "agent")
    return graph.compile()


def digit_share(state: Any) -> float:
    """The digits task's reward: share of the non-space characters of the answer that are digits."""
    text = "".join(state["messages"][-1].content.split())
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0
