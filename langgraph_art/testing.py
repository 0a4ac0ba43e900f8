"""``langgraph_art.testing``: what the project's tests and its integrations' tests share (offline, tiny model).

A weather tool and a LoRA adapter, trained in seconds and cached, that makes the tiny model a two-step tool agent
(it calls ``get_weather``, then answers from the result); the smallest graphs; the digits reward. Nothing here is
imported by the library itself.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph

import langgraph_art as art
from langgraph_art.types import StepResult, TrajectoryGroup

LANGFUSE_VARS = ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_BASE_URL", "LANGFUSE_HOST")
_taken_langfuse_keys: dict[str, str] = {}
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
    pairs: list[tuple[list[dict[str, Any]], str]] = []
    for i, prompt in enumerate(WEATHER_PROMPTS):
        question: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
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


class AdapterDidNotConverge(AssertionError):
    """The shared tool-call adapter did not reach its target; the message has the whole loss history."""


def take_langfuse_keys() -> dict[str, str]:
    """Take the ``LANGFUSE_*`` variables out of the environment and return them: a developer's real keys would make
    every ``Trainer`` in a test suite export there (configuration alone enables it). Later calls return what the
    first one took, so several conftests can call it."""
    import os

    for name in LANGFUSE_VARS:
        if name in os.environ:
            _taken_langfuse_keys[name] = os.environ.pop(name)
    return dict(_taken_langfuse_keys)


def random_lora(model_path: Path, out: Path, seed: int, **config: Any) -> Path:
    """A random (non-zero) peft LoRA adapter for the model in ``model_path``: it changes what the model says."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from langgraph_art.models.quiet import quiet_transformers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with quiet_transformers():
            base = AutoModelForCausalLM.from_pretrained(model_path)
            settings = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "init_lora_weights": False}
            get_peft_model(base, LoraConfig(**{**settings, **config})).save_pretrained(str(out))
    return out


def tool_call_adapter(model_path: Path, cache_dir: Path | None = None) -> Path:
    """``train_tool_call_adapter`` once per tiny-model build: cached under ``LANGGRAPH_ART_CACHE`` (or
    ``cache_dir``) by the model folder's name, which is its content address, and this recipe's version."""
    import os
    import shutil

    root = Path(cache_dir or os.environ.get("LANGGRAPH_ART_CACHE") or Path.home() / ".cache" / "langgraph-art")
    folder = root / "test-adapters" / f"weather-v{_ADAPTER_RECIPE}-{Path(model_path).name}"
    if (folder / "train_info.json").is_file():
        return folder
    staging = folder.with_name(f".{folder.name}.{os.getpid()}")
    train_tool_call_adapter(Path(model_path), staging)
    if folder.exists():  # another process finished first
        shutil.rmtree(staging)
    else:
        staging.rename(folder)
    return folder


_ADAPTER_RECIPE = 1  # bump when train_tool_call_adapter changes what it trains


def train_tool_call_adapter(
    model_path: Path,
    out: Path,
    max_steps: int = 600,
    seed: int = 0,
    learning_rate: float = 3e-3,
    target_prob: float = 0.995,
) -> Path:
    """SFT a LoRA adapter so that the tiny model calls get_weather and then answers from the result: greedily, and
    with temperature 1 too (every target token gets probability >= ``target_prob``).

    Prompts are rendered exactly as the server renders them (same tool JSON), so the adapter sees at run time
    the very prompts it was trained on. Robust on any CPU: a moderate learning rate with gradient clipping (at
    lr 1e-2 the loss reached 0.03 and then diverged to 6 on one machine), the best weights kept (judged by the
    least likely target token, not the mean loss), and a check that says what happened when the target is missed.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from langgraph_art.models.quiet import quiet_transformers
    from langgraph_art.serve.chat import render_prompt
    from langgraph_art.serve.protocol import Tool

    torch.manual_seed(seed)
    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    with quiet_transformers():
        peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    tools = [Tool.model_validate(WEATHER_TOOL).model_dump(exclude_none=True)]
    end = tok.convert_tokens_to_ids("<|im_end|>")
    batch = [
        (render_prompt(tok, messages, tools), [*tok.encode(answer), end])
        for messages, answer in weather_conversations()
    ]
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=learning_rate)
    peft_model.train()
    best: tuple[float, list[torch.Tensor]] = (-float("inf"), [])
    history: list[tuple[int, float, float]] = []  # (step, mean loss, least likely target token's logprob)
    for step in range(1, max_steps + 1):
        loss, worst = torch.zeros(()), float("inf")
        for prompt_ids, target_ids in batch:  # per-example means (a padded batch converged far slower here)
            logits = peft_model(input_ids=torch.tensor([prompt_ids + target_ids])).logits[0]
            logprobs = torch.log_softmax(logits[len(prompt_ids) - 1 : -1].float(), -1)
            picked = logprobs.gather(-1, torch.tensor(target_ids)[:, None])[:, 0]  # [T]
            loss = loss - picked.mean() / len(batch)
            worst = min(worst, picked.min().item())
        history.append((step, loss.item(), worst))
        if worst > best[0]:  # the weights that produced this forward pass, before this step's update
            best = (worst, [p.detach().clone() for p in params])
        if worst >= math.log(target_prob):
            break
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optim.step()
    with torch.no_grad():
        for param, kept in zip(params, best[1], strict=True):
            param.copy_(kept)
    if best[0] < math.log(target_prob):
        trace = ", ".join(f"{s}: {mean:.4f}/{math.exp(w):.3f}" for s, mean, w in history[:: max(1, len(history) // 20)])
        raise AdapterDidNotConverge(
            f"the tool-call adapter did not converge in {max_steps} steps at lr {learning_rate}: the least likely "
            f"target token has p={math.exp(best[0]):.4f} < {target_prob}. History (step: mean loss/worst p): {trace}"
        )
    peft_model.save_pretrained(str(out))
    info = {"steps": len(history), "final_loss": history[-1][1], "worst_token_prob": math.exp(best[0])}
    (out / "train_info.json").write_text(json.dumps(info))
    return out


def tool_loop_graph(llm: Any) -> Any:
    """agent (ChatART with the weather tool) <-> tools, until the agent answers without a tool call."""
    from langgraph_art.demos.lookup import tool_loop

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


def long_run_graph(steps: int) -> Any:
    """A LangGraph loop of ``steps`` node steps, each calling a scripted chat model that answers 32 tokens with
    their logprobs as ChatOpenAI reports them (fresh objects every call): the long agent run for capture costs."""
    from typing import TypedDict

    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langgraph.graph import END, START, StateGraph

    class Scripted(BaseChatModel):
        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            content = [{"token": "t", "logprob": -0.5, "bytes": [116], "top_logprobs": [], "token_id": i}
                       for i in range(32)]  # fmt: skip
            message = AIMessage("t" * 32, response_metadata={"logprobs": {"content": content}, "finish_reason": "stop"})
            return ChatResult(generations=[ChatGeneration(message=message)])

        @property
        def _llm_type(self) -> str:
            return "scripted"

    class Count(TypedDict):
        count: int

    llm = Scripted()

    def step(state: Count) -> dict:
        llm.invoke([HumanMessage("go")])
        return {"count": state["count"] + 1}

    graph = StateGraph(Count)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda s: END if s["count"] >= steps else "step")
    return graph.compile().with_config(recursion_limit=steps + 10)


class FakeBackend:
    """Every method of ``art.Backend``; trains nothing, counts what it was given (the loop's tests: rollouts,
    rewards, metrics and sinks without a model or a server)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.step = 0
        self.received: list[list[art.TrajectoryGroup]] = []
        self.prepared: list[Any] = []

    def register(self, model: art.TrainableModel) -> None:
        pass

    def chat_model_settings(self, model: art.TrainableModel) -> dict[str, Any]:
        return {"base_url": "http://127.0.0.1:9/v1", "api_key": "unused"}

    def store(self, model: art.TrainableModel) -> art.TrajectoryStore:
        return art.TrajectoryStore.for_project(model.project, self.home)

    def run_dir(self, model: art.TrainableModel) -> Path:
        return self.home / "runs" / model.name

    def current_step(self, model: art.TrainableModel) -> int:
        return self.step

    def engine_stats(self, model: art.TrainableModel) -> dict[str, float]:
        return {}

    def trainer(self, model: art.TrainableModel, config: art.GRPOConfig | None = None) -> None:
        self.prepared.append(config)

    def train_step(
        self, model: art.TrainableModel, groups: Sequence[TrajectoryGroup], config: art.GRPOConfig | None = None
    ) -> StepResult:
        self.received.append(list(groups))
        self.step += 1
        rewards = {t.id: t.reward or 0.0 for g in groups for t in g.completed()}
        mean = sum(rewards.values()) / len(rewards)
        return StepResult(self.step, True, {"train/loss": 0.25}, advantages={i: r - mean for i, r in rewards.items()})

    def warmup(self, model: art.TrainableModel, examples: Any, **kwargs: Any) -> list[float]:
        return [1.0] * kwargs["steps"]


def echo_graph() -> Any:
    """One async node that answers ``seen <number of messages>``."""

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"seen {len(state['messages'])}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_edge(START, "agent")
    return graph.compile()
