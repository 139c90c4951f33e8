"""Environments: the text-game protocol, a failure-containing runner, a loader and built-in tasks.

Built-ins: `arith` (single-turn arithmetic, "#### <answer>", format-aware reward), `calculator`
(arithmetic with a calculator tool), `gridworld` (FrozenLake-style grid with a fixed action set),
`gridworld-shift` (the same game whose observations grow after N episodes: a workload shift),
`guess` (number guessing, "higher"/"lower"), and `dataset` (single-turn prompts from a JSONL or
Parquet file graded by a Python reward function named by path, `pearl.envs.dataset`). Load any of them, or a user's
class by dotted path, with `load_env`. This package imports nothing from `pearl.rl` or the engines.
"""
from pearl.envs.base import BaseEnv, Env, EnvRunner, StepResult, play_episode
from pearl.envs.loader import BUILTIN_ENVS, check_env, load_env, protocol_gaps

__all__ = ["BUILTIN_ENVS", "BaseEnv", "Env", "EnvRunner", "StepResult", "check_env", "load_env",
           "play_episode", "protocol_gaps"]
