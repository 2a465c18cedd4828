"""How a decision is held to its domain (pin, prefer or gate), decided from the settings: placed
consolidated and distributed workloads are pinned, balanced ones prefer; a wait is pinned, gated or
only preferred as `pin_when_waiting`, `pin_only_where_locality_pays` and `gate_waits` say, and as
waiting pays for the workload. The decision carries the answer (`Decision.hold`): the mutation
writes it (and the domain a wait waits in: core/injection.py's waited_domain), the simulator reads
it, and neither decides it again."""
from __future__ import annotations

import dataclasses

from ..core.model import NO_ROOM_NOW, Decision, Hold, Outcome
from ..core.strategies import Waits
from ..settings.config import Config


def enforced(decision: Decision, config: Config) -> Decision:
    """`decision` carrying how it is held (None for NEVER: nothing is written)."""
    return dataclasses.replace(decision, hold=how_held(decision, config))


def how_held(decision: Decision, config: Config) -> Hold | None:
    if decision.outcome is Outcome.NEVER:
        return None
    if not pins(decision, config):
        return Hold.PREFER
    return Hold.GATE if _gated(decision, config) else Hold.PIN


def pins(decision: Decision, config: Config) -> bool:
    """Whether the decision becomes required node affinity rather than a preference, as the
    strategy's rules say (core/strategies.py): placed consolidated and distributed workloads are
    pinned to their domain (distributed to the scope its spread runs in), balanced ones only prefer it. A waiting consolidated one is pinned to
    where it waits when `pin_when_waiting` is on, unless waiting for locality does not pay
    (`Decision.locality_pays`); so is a balanced one waiting for room where
    `pin_only_where_locality_pays` weighed its wait and the request allows it (no preference of the
    user's, a workload whose work ends: `PlacementRequest.may_pin_wait`); else it only prefers. A workload
    with a max-domain is always pinned: a preference could let the scheduler spill it wider."""
    rules = decision.request.strategy.rules
    if decision.request.max_domain is not None:
        return decision.outcome in (Outcome.PLACED, Outcome.WAIT)  # a ceiling only a requirement can keep
    if decision.outcome is Outcome.PLACED:
        return rules.pinned
    if decision.outcome is not Outcome.WAIT or not config.pin_when_waiting or not decision.locality_pays:
        return False
    return rules.waits is Waits.PINNED or (rules.waits is Waits.PINNED_WHERE_IT_PAYS and decision.code == NO_ROOM_NOW
                                           and decision.request.may_pin_wait and config.pin_only_where_locality_pays)


def _gated(decision: Decision, config: Config) -> bool:
    """Whether a pinned wait is held by our scheduling gate instead (`gate_waits`): a wait for
    room, in a workload whose work ends (`PlacementRequest.may_pin_wait`: a Deployment's template
    would gate its pods for good) that names its domain."""
    return (config.gate_waits and decision.outcome is Outcome.WAIT and decision.code == NO_ROOM_NOW
            and decision.scope is not None and bool(decision.scope.path) and decision.request.may_pin_wait)
