"""The fault plan: which failure the next ticket-writing request gets, and how a refusal answers."""

import email.utils
import math
import random
import threading
import time
from collections import deque
from dataclasses import dataclass

# Fault name -> how it takes its seconds argument: "required", "optional" or None (no argument).
FAULT_ARGUMENTS = {
    "ok": None,
    "rate_limit": "required",
    "rate_limit_date": "required",
    "unavailable_503": "optional",
    "error_500": None,
    "reject_422": None,
    "unauthorized_401": None,
    "drop_before_commit": None,
    "drop_after_commit": None,
    "stall_before_commit": "required",
    "stall_after_commit": "required",
}


@dataclass(frozen=True)
class Fault:
    name: str
    seconds: float | None = None
    spec: str = "ok"


OK = Fault("ok")


def parse_fault(spec) -> Fault:
    """`"rate_limit:2"` -> Fault("rate_limit", 2.0). Raises ValueError for anything unknown."""
    name, has_argument, argument = str(spec).partition(":")
    if name not in FAULT_ARGUMENTS:
        raise ValueError(f"unknown fault {spec!r}; known: {', '.join(FAULT_ARGUMENTS)}")
    takes = FAULT_ARGUMENTS[name]
    if not has_argument:
        if takes == "required":
            raise ValueError(f"fault {name} needs a number of seconds, e.g. {name}:2")
        return Fault(name, None, name)
    if takes is None:
        raise ValueError(f"fault {name} takes no argument")
    try:
        seconds = float(argument)
    except ValueError:
        raise ValueError(f"fault {spec!r}: {argument!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"fault {spec!r}: seconds must be a finite number >= 0")
    return Fault(name, seconds, str(spec))


class FaultPlan:
    """Which fault the next ticket-writing request gets.

    The queued list comes first (FIFO); when it is empty a seeded random draw is
    used if one was configured, else `ok`. The draw uses its own `random.Random`,
    so the n-th request gets the same fault for the same seed and weights.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._queue: deque[Fault] = deque()
        self._random_spec = None
        self._rng = None
        self._weights: list[tuple[Fault, float]] = []

    def replace(self, faults=(), random_spec=None):
        queue = deque(parse_fault(spec) for spec in faults)
        weights, rng = [], None
        if random_spec is not None:
            weights, rng = self._parse_random(random_spec)
        with self._lock:
            self._queue = queue
            self._random_spec = random_spec
            self._weights, self._rng = weights, rng

    @staticmethod
    def _parse_random(spec):
        if not isinstance(spec, dict) or not isinstance(spec.get("weights", {}), dict):
            raise ValueError('random must look like {"seed": 7, "weights": {"error_500": 0.1}}')
        seed = spec.get("seed", 0)
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError("random.seed must be an integer")
        weights = []
        for fault_spec, weight in spec.get("weights", {}).items():
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0:
                raise ValueError(f"weight of {fault_spec!r} must be a number >= 0")
            weights.append((parse_fault(fault_spec), float(weight)))
        if sum(weight for _, weight in weights) > 1 + 1e-9:
            raise ValueError("random weights are probabilities: they must add up to at most 1 (the rest is ok)")
        return weights, random.Random(seed)

    def next(self) -> Fault:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            if self._rng is None:
                return OK
            draw, cumulative = self._rng.random(), 0.0
            for fault, weight in self._weights:
                cumulative += weight
                if draw < cumulative:
                    return fault
            return OK

    def describe(self) -> dict:
        with self._lock:
            return {"faults": [fault.spec for fault in self._queue], "random": self._random_spec}


def _retry_after_seconds(seconds: float) -> str:
    # Retry-After carries whole seconds; round up so a client never comes back early.
    return str(math.ceil(seconds))


def rejection_for(fault: Fault):
    """The answer of a fault that refuses the request before anything is written, or None."""
    if fault.name == "rate_limit":
        return (
            429,
            {"Retry-After": _retry_after_seconds(fault.seconds)},
            {"error": "TooManyRequests", "description": "Rate limit exceeded"},
        )
    if fault.name == "rate_limit_date":
        at = email.utils.formatdate(time.time() + fault.seconds, usegmt=True)
        return 429, {"Retry-After": at}, {"error": "TooManyRequests", "description": "Rate limit exceeded"}
    if fault.name == "unavailable_503":
        headers = {} if fault.seconds is None else {"Retry-After": _retry_after_seconds(fault.seconds)}
        return 503, headers, {"error": "ServiceUnavailable", "description": "Try again later"}
    if fault.name == "error_500":
        return 500, {}, {"error": "InternalServerError", "description": "Something went wrong"}
    if fault.name == "reject_422":
        return (
            422,
            {},
            {
                "error": "RecordInvalid",
                "description": "Record validation errors",
                "details": {"requester": [{"description": "Requester email is invalid"}]},
            },
        )
    if fault.name == "unauthorized_401":
        return 401, {}, {"error": "Couldn't authenticate you"}
    return None
