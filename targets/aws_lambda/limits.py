"""How much one invocation may pass back, by who invoked it: read by `build` (the served
spec's bounds) and by the handler (each event's). Light on purpose: the handler imports it
in the init phase."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The answer's JSON is escaped again inside Lambda's envelope (its body is a string there):
# answers are bounded this share of the limit before any work.
ENVELOPE_SHARE = 0.95


@dataclass(frozen=True)
class AnswerBound:
    """The most bytes of response JSON an invocation may return, and whose limit it is."""

    bytes: int
    whose: str


# Synchronous invocations, buffered function URLs and API Gateway: 6 MB each way (streamed
# answers need a runtime mangum does not run on).
LAMBDA = AnswerBound(6 * 1024 * 1024, "Lambda's 6 MB for one invocation's answer")
# An Application Load Balancer's Lambda target: 1 MB of response JSON, else the ALB answers
# 502. AWS says "1 MB": the smaller reading, 10^6 bytes.
ALB = AnswerBound(1_000_000, "an Application Load Balancer's 1 MB for a Lambda function's answer (a "
                  "function URL or API Gateway passes 6 MB)")
PAYLOAD_BYTES = LAMBDA.bytes


def answer_bound(event: dict[str, Any]) -> AnswerBound:
    """The bound of the invocation `event` starts: an ALB's events carry requestContext.elb."""
    return ALB if "elb" in (event.get("requestContext") or {}) else LAMBDA
