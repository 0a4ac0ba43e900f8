"""A pipelined training run to kill: ``python -m tests.pipeline_worker HOME STEPS [process]``.

The digits task on the embedded tiny model with ``max_steps_off_policy=1`` (``process``: its trainer in a child
process, ``LocalBackend(trainer_process=True)``); after each trained step the metrics line lands in
``metrics.jsonl`` (the test watches it). Prints ``resumed <step>`` when the trainer has loaded, then with
``process`` ``trainer pid <pid>``.
"""

from __future__ import annotations

import sys

import langgraph_art as art
from tests.helpers import digit_share, one_agent_graph

digits = art.reward(digit_share, name="digits")


SCENARIOS = [{"id": "numbers", "input": {"messages": [("user", "Write some numbers.")]}}]


def digits_trainer(backend: art.LocalBackend, max_tokens: int, seed: int = 0) -> tuple[art.TrainableModel, art.Trainer]:
    """The pipelined digits run (``max_steps_off_policy=1``) the tests train, here and in the test itself.

    Learning rate 2e-3: at 5e-3 two of 13 seeds learned the task and then lost it for good one step after a
    half-right group (the tiny model's policy is near-deterministic by then, and a one-step-stale update flipped
    it to a digit-free mode no group ever leaves); synchronous runs at 5e-3 never did (0 of 11), and at 2e-3 none
    of the 13 pipelined seeds did, 11 learned. The other 2 never emit a digit to learn from, synchronous or not."""
    model = art.TrainableModel(name="digits", project="pipelined").register(backend)
    llm = art.ChatART(model=model, temperature=1.0, max_tokens=max_tokens)
    config = art.GRPOConfig(learning_rate=2e-3, lora_r=8, lora_alpha=16, seed=seed)
    trainer = art.Trainer(
        one_agent_graph(llm), model, rewards=[digits], num_generations=8, config=config, max_steps_off_policy=1
    )
    return model, trainer


def main() -> None:
    home, steps, process = sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["process"]
    with art.LocalBackend(home=home, trainer_process=process) as backend:
        model, trainer = digits_trainer(backend, max_tokens=16)
        backend.trainer(model, trainer.config)
        print(f"resumed {backend.current_step(model)}", flush=True)
        if process:
            with backend.policies(model.base_model).lease(model.project, model.name) as live:
                print(f"trainer pid {live.pid}", flush=True)
        trainer.train(SCENARIOS, steps=steps, progress=False)
        print("finished", flush=True)


if __name__ == "__main__":
    main()
