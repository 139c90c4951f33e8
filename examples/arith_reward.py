"""An example reward function for `env: {name: dataset}` (see examples/README.md).

A reward function is plain Python: `fn(completion: str, **row) -> float`, called with the model's
answer and the row's columns (here `answer`; the `prompt` column and any others arrive in `**row`).
This one grades like the built-in `arith` task (`pearl.envs.arith.arith_reward`): 1.0 for the right
number after `####`, 0.5 when the last number in the text is right but there is no `####`, 0.2 for a
wrong number after `####` (the format is right), else 0.
"""
import re

FINAL = re.compile(r"####\s*\**\s*(-?\d[\d,]*(?:\.\d+)?)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _value(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def exact_match(completion: str, answer, **row) -> float:
    target = float(answer)
    final = FINAL.search(completion)  # the first #### answer counts
    if final:
        got = _value(final.group(1))
        return 1.0 if got is not None and abs(got - target) < 1e-6 else 0.2
    numbers = NUMBER.findall(completion)
    last = _value(numbers[-1]) if numbers else None
    return 0.5 if last is not None and abs(last - target) < 1e-6 else 0.0
