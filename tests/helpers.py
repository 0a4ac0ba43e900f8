"""Test helpers that need torch (imported lazily by fixtures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_PROMPTS = [
    "What is the weather in Paris?",
    "Weather in Paris please",
    "Is it raining in Paris today?",
]
WEATHER_CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def train_tool_call_adapter(model_path: Path, out: Path, max_steps: int = 200, seed: int = 0) -> Path:
    """SFT a LoRA adapter on the tiny model so that, greedily, it answers the weather prompts with a tool call."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path)
    peft_model = get_peft_model(
        model,
        LoraConfig(
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
    )
    target = [*tok.encode(WEATHER_CALL), tok.convert_tokens_to_ids("<|im_end|>")]
    batch = []
    for prompt in WEATHER_PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        ids = tok.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, return_dict=False)
        batch.append((list(ids), target))
    optim = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    peft_model.train()
    for steps in range(1, max_steps + 1):  # noqa: B007 - reported below
        loss = torch.zeros(())
        for prompt_ids, target_ids in batch:
            ids = torch.tensor([prompt_ids + target_ids])
            labels = torch.tensor([[-100] * len(prompt_ids) + target_ids])
            loss = loss + peft_model(input_ids=ids, labels=labels).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
        if loss.item() / len(batch) < 0.005:
            break
    peft_model.save_pretrained(out)
    (out / "train_info.json").write_text(json.dumps({"final_loss": loss.item() / len(batch), "steps": steps}))
    return out
