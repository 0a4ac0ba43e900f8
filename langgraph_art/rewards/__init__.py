"""Rewards: ``@reward`` functions, the group-relative ``RulerJudge``, and their combination."""
