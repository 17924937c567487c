"""When an idempotent effect's next attempt is due: exponential backoff with jitter.

Attempt n (1-based) that ended uncertain or retryable waits ``d = min(max, base * 2**(n-1))``,
drawn uniformly from ``[d/2, d]`` ("equal jitter": spread, yet never shorter than half the
step, so the recorded retry times of one effect grow).
"""

from __future__ import annotations

import random


def next_attempt_at(now_ms: int, attempt_number: int, base_ms: int, max_ms: int, rng: random.Random) -> int:
    step = min(max_ms, base_ms * 2 ** max(0, min(attempt_number - 1, 40)))
    return now_ms + step // 2 + rng.randint(0, step - step // 2)
