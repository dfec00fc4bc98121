"""The shells' side of the gauge (launch/gauge.py): read the round's board, make the rates, and carry them out:
a ``rates`` record of the event log, the console's lines every ``HETERPS_STATUS_EVERY_S``, and the machine's
``Measured`` event (the caller feeds it).  The one-host launch and the coordinator both use it."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping, cast

from heterps_paddle import settings
from heterps_paddle.launch.event_log import EventLog, JobLog
from heterps_paddle.launch.gauge import Gauge, Rates
from heterps_paddle.rendezvous import METER_PREFIX, PLAN_KEY


def idle_units(
    held: Iterable[tuple[str, str, int]],
    joined: Mapping[str, Mapping[str, Any]],
    connected: Iterable[str],
    members: Iterable[str],
) -> dict[str, int]:
    """Units by type of the hosts the job holds that run nothing of the round: connected to the coordinator (standing
    by, a lost host back, a machine that joined, waiting for the next checkpoint) but not the round's members.
    ``held``: the hosts file's (address, type, units); ``joined``: machines from outside it (what they said they
    are)."""
    types = {address: (kind, units) for address, kind, units in held}
    for address, spec in joined.items():
        types[address] = (str(spec.get("type")), int(spec.get("units", 1) or 1))
    out: dict[str, int] = {}
    for address in sorted(set(connected) - set(members)):
        if address in types:
            kind, units = types[address]
            out[kind] = out.get(kind, 0) + units
    return out


class Measuring:
    """``say``: a console line; ``log``: the event log the rates go to."""

    def __init__(self, log: EventLog | JobLog | None, say: Callable[[str], None]):
        window = float(cast(float, settings.get("HETERPS_RATES_WINDOW_S")))
        straggler = float(cast(float, settings.get("HETERPS_STRAGGLER_SHARE")))
        self.gauge = Gauge(window_s=window, every_s=max(1.0, window / 3), straggler_share=straggler)
        self.every_s = float(cast(float, settings.get("HETERPS_STATUS_EVERY_S")))
        self.log = log
        self.say = say
        self.said_at = time.monotonic()

    def tick(
        self,
        round_number: int,
        board: Any,
        devices: tuple[str, ...] = (),
        force: bool = False,
        idle: Mapping[str, int] | None = None,
    ) -> Rates | None:
        """The board's meter and plan records now; the rates when a window's are made (None: not yet).
        ``devices``: the round's heterogeneous stages' devices (Paddle's --heter_devices), stage 2 first;
        ``force``: make them now (a round's end), whatever the interval; ``idle``: units by type of the hosts the
        job holds that run nothing of the round (:func:`idle_units`), paid for all the same."""
        self.gauge.idle = dict(idle or {})
        self.gauge.gpu_stages = frozenset(n for n, device in enumerate(devices, 2) if device == "gpu")
        try:
            meters: Mapping[str, Any] = board.entries(METER_PREFIX)
            plan = board.get(PLAN_KEY)
        except Exception:  # a board being replaced, a file half there: the next tick reads it
            return None
        if force:
            self.gauge.last_made = float("-inf")
        rates = self.gauge.observe(time.time(), round_number, meters, plan)
        if rates is None:
            return None
        if self.log is not None:
            self.log.write("rates", **rates.to_record())
        if force or time.monotonic() - self.said_at >= self.every_s:
            self.said_at = time.monotonic()
            for line in rates.lines():
                self.say(line)
        return rates
