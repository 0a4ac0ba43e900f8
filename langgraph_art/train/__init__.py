"""Training: tokenize trajectories, group advantages, losses, the GRPO step, checkpoints. Needs torch + peft."""
