"""Dynamic sampling (DAPO): a group whose runs all scored the same has no advantage to teach, so a step samples
further scenarios in its place, up to a bound of further groups per step (``Trainer(dynamic_sampling=N)``).

The step's reward metrics stay those of the groups it asked for (comparable with a step without dynamic
sampling); what the further groups did is in ``dynamic_sampling/*``. The further scenarios are the next ones of the
training list (``train`` cycles through it), sampled with the policy served at that moment.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from langgraph_art.train.advantages import is_uniform
from langgraph_art.types import TrajectoryGroup


async def refill(
    groups: Sequence[TrajectoryGroup],
    sample: Callable[[int], Awaitable[list[TrajectoryGroup]]],
    score: Callable[[list[TrajectoryGroup]], Awaitable[object]],
    max_extra: int,
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """Further groups for the uniform ones among ``groups``: ``sample(n)`` rolls out the next ``n`` scenarios,
    ``score`` scores them; a further group that is uniform too is replaced in turn, until none is left to replace or
    ``max_extra`` further groups were sampled. Returns them (scored) and the ``dynamic_sampling/*`` metrics."""
    uniform = sum(map(is_uniform, groups))
    extra: list[TrajectoryGroup] = []
    wanted = uniform
    while wanted and len(extra) < max_extra:
        batch = await sample(min(wanted, max_extra - len(extra)))
        await score(batch)
        extra += batch
        wanted = sum(map(is_uniform, batch))
    still = sum(map(is_uniform, extra))
    return extra, {
        "dynamic_sampling/uniform_groups": float(uniform),  # of the groups the step asked for
        "dynamic_sampling/extra_groups": float(len(extra)),
        "dynamic_sampling/extra_uniform": float(still),  # further groups that were uniform too
        "dynamic_sampling/replaced": float(len(extra) - still),  # uniform groups replaced by ones that teach
    }
