"""``LocalBackend(trainer_process=True)``: each trainer runs in a child process (``train.process.ProcessTrainer``).

It trains and its checkpoints are served as in process; an error there is raised here with its own class; a child
that dies during a call fails that call, and the next call starts a new child that resumes from the latest
checkpoint (so does a call that finds its child dead); closing the backend ends the child. (That a killed parent
leaves no child behind is in ``test_pipelined_training.py``.)"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

import langgraph_art as art
from langgraph_art.errors import TrainingAborted
from langgraph_art.train.process import ProcessTrainer, portable, without_final_state
from langgraph_art.types import Trajectory, TrajectoryGroup
from tests.helpers import one_agent_graph, wait_until

SCENARIOS = [{"id": "hi", "input": {"messages": [("user", "Say something.")]}}]


@art.reward
def varied(metadata: dict[str, Any]) -> float:
    """Differs between the runs of a group whatever they sampled: every step updates."""
    return metadata["generation"] / 4


def exited(pid: int) -> bool:
    """The process is gone or a zombie (a container's init may not reap a grandchild)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_for_exit(pid: int) -> None:
    wait_until(lambda: exited(pid), f"process {pid} to exit")


def raised(call: Any) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # noqa: BLE001 - the test inspects it
        return exc
    return None


def live_trainer(backend: art.LocalBackend, model: art.TrainableModel) -> Any:
    with backend.policies(model.base_model).lease(model.project, model.name) as trainer:
        return trainer


def test_trainer_process_cannot_share_the_engines_weights(tmp_path: Path) -> None:
    with pytest.raises(art.ConfigError, match="cannot share the engine's"):
        art.LocalBackend(home=tmp_path, trainer_process=True, engine_options={"share_weights": True})


def test_an_exception_that_does_not_pickle_comes_back_as_a_runtime_error_naming_it() -> None:
    class Odd(Exception):
        def __init__(self, callback: Any) -> None:
            super().__init__("odd")
            self.callback = callback

    back = portable(Odd(lambda: None))  # a lambda does not pickle
    assert type(back) is RuntimeError and "Odd: odd" in str(back) and "in the trainer process (pid" in str(back)


def test_runs_go_to_the_trainer_process_without_their_final_state() -> None:
    """The graph's output may hold anything (a client, a lock); the trainer needs turns, rewards and metadata."""
    run = Trajectory(id="r")
    client = threading.Lock()  # does not pickle
    run.final_state = {"client": client}
    group = TrajectoryGroup(id="g", scenario_id="s", trajectories=[run])
    sent = pickle.loads(pickle.dumps(without_final_state(group)))
    assert sent.trajectories[0].id == "r" and sent.trajectories[0].final_state is None
    assert group.trajectories[0] is run and run.final_state == {"client": client}  # the caller's run keeps it


@pytest.mark.slow
def test_a_trainer_process_trains_is_served_survives_a_kill_and_ends_on_close(tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path, trainer_process=True) as backend:
        model = art.TrainableModel(name="child", project="proc").register(backend)
        llm = art.ChatART(model=model, temperature=1.0, max_tokens=8)  # type: ignore[call-arg]
        config = art.GRPOConfig(learning_rate=1e-3, seed=0)
        trainer = art.Trainer(one_agent_graph(llm), model, rewards=[varied], num_generations=4, config=config)
        history = trainer.train(SCENARIOS, steps=2, progress=False)
        assert [m["train/updated"] for m in history] == [1.0, 1.0]
        child = live_trainer(backend, model)
        assert isinstance(child, ProcessTrainer) and child.pid not in (None, os.getpid())
        first_pid = child.pid
        assert backend.current_step(model) == 2
        assert f"{model.served_name}@2" in backend.server(model.base_model).engine.adapters()

        os.kill(first_pid, signal.SIGKILL)  # between steps (out of memory, say)
        wait_for_exit(first_pid)
        metrics = trainer.train_step(SCENARIOS)  # a new child, resumed from checkpoint 2
        assert metrics["step"] == 3.0 and backend.current_step(model) == 3
        child = live_trainer(backend, model)
        second_pid = child.pid
        assert second_pid not in (None, first_pid)

        os.kill(second_pid, signal.SIGSTOP)  # during a call: it cannot answer before the kill
        failure: list[BaseException | None] = []
        in_call = threading.Event()
        exchange = child._exchange

        def exchanging(*args: Any) -> Any:
            in_call.set()  # the call reached the pipe (past the check that its child lives)
            return exchange(*args)

        child._exchange = exchanging  # type: ignore[method-assign]
        call = threading.Thread(target=lambda: failure.append(raised(child.save_checkpoint)))
        call.start()
        assert in_call.wait(30), "save_checkpoint never reached the pipe"
        os.kill(second_pid, signal.SIGKILL)
        call.join(60)
        assert not call.is_alive(), "save_checkpoint still waits for a child that was killed"
        assert isinstance(failure[0], TrainingAborted), failure
        assert "exited (code -9) during save_checkpoint" in str(failure[0])
        metrics = trainer.train_step(SCENARIOS)
        assert metrics["step"] == 4.0
        third_pid = live_trainer(backend, model).pid
        assert third_pid not in (None, first_pid, second_pid)
    assert exited(third_pid)  # closing the backend ended it


@pytest.mark.slow
def test_errors_in_the_trainer_process_keep_their_class_and_say_where(tmp_path: Path) -> None:
    with art.LocalBackend(home=tmp_path, trainer_process=True) as backend:
        model = art.TrainableModel(name="child", project="proc").register(backend)
        backend.trainer(model, art.GRPOConfig(lora_r=8))
        with pytest.raises(art.ConfigError, match="cannot change for a model that already has a LoRA") as info:
            backend.trainer(model, art.GRPOConfig(lora_r=16))
        assert any("in the trainer process (pid" in note for note in getattr(info.value, "__notes__", []))
        backend.trainer(model, art.GRPOConfig(lora_r=8, learning_rate=1e-4))  # the child took no harm
