"""Scale-out on CUDA (``benchmarks/gpu_scale_out.sh`` runs these on a lent GPU machine): NCCL trainer ranks train what
one rank trains (two GPUs), a trainer rank process on its GPU, and replicas publishing checkpoints on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from langgraph_art.config import GRPOConfig  # noqa: E402
from langgraph_art.train.process import ProcessTrainer  # noqa: E402
from langgraph_art.train.trainer import GRPOTrainer  # noqa: E402
from tests.test_data_parallel import assert_same_lora, groups_for  # noqa: E402
from tests.test_replicas import check_replicas  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (benchmarks/gpu_scale_out.sh)"),
]
CONFIG = GRPOConfig(learning_rate=1e-2, per_device_train_batch_size=2, seed=3, dtype="float32")


def test_a_trainer_process_trains_on_the_gpu(tiny_path: Path, tmp_path: Path) -> None:
    one = GRPOTrainer(str(tiny_path), CONFIG, checkpoint_dir=tmp_path / "one", device="cuda")
    child = ProcessTrainer(str(tiny_path), CONFIG, checkpoint_dir=tmp_path / "child", device="cuda")
    try:
        groups = groups_for(one, 0)
        assert one.step(groups).updated and child.step(groups).updated
        assert_same_lora(one.save_checkpoint(), child.save_checkpoint())
    finally:
        child.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL ranks need a GPU each: two GPUs")
def test_two_nccl_ranks_train_what_one_rank_trains(tiny_path: Path, tmp_path: Path) -> None:
    one = GRPOTrainer(str(tiny_path), CONFIG, checkpoint_dir=tmp_path / "one", device="cuda:0")
    two = ProcessTrainer(str(tiny_path), CONFIG, checkpoint_dir=tmp_path / "two", device="cuda", ranks=2)
    try:
        for step in range(3):
            groups = groups_for(one, step)
            expected, got = one.step(groups), two.step(groups)
            assert got.step == expected.step
            assert got.metrics["train/loss"] == pytest.approx(expected.metrics["train/loss"], rel=1e-4, abs=1e-6)
        assert_same_lora(one.save_checkpoint(), two.save_checkpoint())
    finally:
        two.close()


def test_replicas_serve_each_new_checkpoint_on_the_gpu(tiny_path: Path, tmp_path: Path) -> None:
    check_replicas(tiny_path, tmp_path, device="cuda")
