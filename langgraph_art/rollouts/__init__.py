"""Where a training step's runs happen: ``Rollouts`` (what ``Trainer(rollouts=...)`` takes) and ``RayRollouts``, a
step's runs fanned out to Ray actors (``pip install 'langgraph-art[ray]'``; ``on_ray.py``, its actor in
``worker.py``, what travels in ``pickling.py``).

``Trainer(graph, model, rewards=..., rollouts=art.RayRollouts(num_workers=4))`` runs each step's rollouts on N
``RolloutWorker`` actors instead of the trainer's own event loop. Each actor holds the graph, cloudpickled once per
actor (and again when the trainer's graph object changes), and runs each run with ``arollout`` on its own event loop,
up to ``max_concurrency / N`` at a time. The driver (the trainer's process) receives each run as it finishes, stores
it once, builds the groups in scenario order and hands them to the rewards, which run here, unchanged. Evaluation
(``eval_scenarios``) runs in the trainer's process.

Failures: a run whose graph raises is a ``failed`` trajectory, as in ``agather_groups``. A worker that dies (its
process killed, its node lost) has its in-flight runs retried on the other workers (or on its replacement), up to
``max_retries`` times per run; a run that exhausts them is a ``failed`` trajectory naming the lost worker: stored,
counted in ``runs/failed``, never trained on. A dead worker is replaced for the next runs, a warning names it and
how many runs were retried, and the step's record counts both (``rollouts/retried``, ``rollouts/workers_lost``).

``import langgraph_art`` never imports Ray: this module imports it when a ``RayRollouts`` is made.
"""

from langgraph_art.rollouts.on_ray import RayRollouts
from langgraph_art.rollouts.protocol import RolloutBatch, Rollouts

__all__ = ["RayRollouts", "RolloutBatch", "Rollouts"]
