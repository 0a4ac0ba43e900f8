"""Inference engines. ``base`` is light; ``hf`` needs torch/transformers/peft; ``vllm`` needs vllm."""
