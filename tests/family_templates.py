"""Chat templates of the model families, as offline fixtures: minimal look-alikes of each family's own template
(its system turn and tool list trimmed; the parts that render an assistant's tool calls, a plain answer and the
generation prompt written as the family's template writes them), each with the special tokens its tokenizer has.

Sources read for them: Qwen2.5's template (the copy inside the Qwen2.5-Coder GGUF), Llama 3.1's JSON tool calling
(``{"name": ..., "parameters": ...}``, one call a turn), Llama 3.2's pythonic template in vLLM's examples, Mistral
7B v0.3's (``[TOOL_CALLS] [...]``, 9-character ids checked), Phi-4-mini's ``functools[...]``, gpt-oss's harmony
template (a call is ``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>``),
Qwen3's (``<think>`` blocks, ``enable_thinking``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

_USER = (
    "{%- for message in messages %}{%- if message.role == 'user' %}{{- '<|user|>' + message.content + '<|end|>' }}"
    "{%- elif message.role == 'tool' %}{{- '<|tool|>' + message.content + '<|end|>' }}"
)
_PROMPT = "{%- endfor %}{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}"

QWEN2_5 = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for call in message.tool_calls or [] %}{%- set call = call.function %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' }}'
    "{{- (call.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

QWEN3 = QWEN2_5.replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}",
)

LLAMA3_JSON = (
    "{{- '<|begin_of_text|>' }}"
    "{%- for message in messages %}"
    "{%- if message.tool_calls %}"
    "{%- if message.tool_calls | length != 1 %}"
    "{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{{- '{\"name\": \"' + call.name + '\", \"parameters\": ' + (call.arguments | tojson) + '}<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

PYTHONIC = (
    "{%- for message in messages %}"
    "{%- if message.tool_calls %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n[' }}"
    "{%- for call in message.tool_calls %}{%- set call = call.function %}{{- call.name + '(' }}"
    "{%- for name, value in call.arguments.items() %}{{- name + '=' + (value | tojson) }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- ')' }}"
    "{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}{{- ']<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

MISTRAL = (
    "{{- '<s>' }}{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '[INST] ' + message.content + '[/INST]' }}"
    "{%- elif message.tool_calls %}{{- '[TOOL_CALLS] [' }}"
    "{%- for call in message.tool_calls %}{%- set out = call.function | tojson %}{{- out[:-1] }}"
    "{%- if not call.id is defined or call.id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "{{- ', \"id\": \"' + call.id + '\"}' }}{%- if not loop.last %}{{- ', ' }}{%- else %}{{- ']</s>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- elif message.role == 'tool' %}"
    '{{- \'[TOOL_RESULTS] {"content": \' + (message.content | tojson) + \', "call_id": "\' + message.tool_call_id '
    "+ '\"}[/TOOL_RESULTS]' }}"
    "{%- else %}{{- message.content + '</s>' }}{%- endif %}{%- endfor %}"
)

PHI4_MINI = (
    _USER + "{%- elif message.tool_calls %}"
    "{{- '<|assistant|>functools' + (message.tool_calls | map(attribute='function') | list | tojson) + '<|end|>' }}"
    "{%- else %}{{- '<|assistant|>' + message.content + '<|end|>' }}{%- endif %}" + _PROMPT
)

GPT_OSS = (
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{{- '<|start|>user<|message|>' + message.content + '<|end|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|start|>functions.tool to=assistant<|channel|>commentary<|message|>' + message.content + '<|end|>' }}"
    "{%- elif message.tool_calls %}"
    "{%- if message.tool_calls | length > 1 %}{{- raise_exception('one tool call a message') }}{%- endif %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '<|start|>assistant to=functions.' + call.name + '<|channel|>commentary json<|message|>' }}"
    "{{- (call.arguments | tojson) + '<|call|>' }}"
    "{%- else %}{{- '<|start|>assistant<|channel|>final<|message|>' + message.content + '<|return|>' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    parser: str  # the tool-call parser "auto" should choose
    special: tuple[str, ...] = ()  # special tokens of the family's tokenizer (added to the tiny one's)
    parallel: bool = True  # the template renders two calls in one message
    reasoning: str | None = None


FAMILIES = [
    Family("qwen2.5", QWEN2_5, "xlam"),
    Family(
        "llama3.1",
        LLAMA3_JSON,
        "llama3_json",
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        parallel=False,
    ),
    Family("llama3.2-pythonic", PYTHONIC, "pythonic", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    Family(
        "mistral",
        MISTRAL,
        "mistral",
        ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
    ),
    Family("phi4-mini", PHI4_MINI, "phi4_mini_json", ("<|user|>", "<|assistant|>", "<|end|>", "<|tool|>")),
    Family(
        "gpt-oss",
        GPT_OSS,
        "openai",
        ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>", "<|constrain|>"),
        parallel=False,
        reasoning="openai_gptoss",
    ),
    Family("qwen3", QWEN3, "xlam", reasoning="qwen3"),
]


def family_tokenizer(tokenizer: Any, family: Family) -> Any:
    """A copy of ``tokenizer`` with the family's template and special tokens."""
    styled = copy.deepcopy(tokenizer)
    if family.special:
        styled.add_special_tokens({"additional_special_tokens": list(family.special)})
    styled.chat_template = family.template
    return styled
