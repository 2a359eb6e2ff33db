"""A daily time window (``from``-``to`` wall-clock time, in UTC or a named time zone).

The rule is CouchDB's, minute precision: with ``from < to`` the window is open for
``from <= now < to``; otherwise (``from == to`` included) it is open for ``now >= from or
now < to``, so it wraps at midnight and ``from == to`` means always open. Unlike CouchDB, a
malformed time is an error here (CouchDB logs it and silently opens the window all day),
and hours and minutes are range-checked (CouchDB accepts ``25:00``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone as _dt_timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["Window", "parse_time"]

#: Minutes in a day: ``24:00`` as the end of a window means "until midnight".
MINUTES_PER_DAY = 24 * 60

#: ``H:MM`` or ``HH:MM``, ASCII digits only (``\d`` would also match other scripts' digits).
_TIME_RE = re.compile(r"([0-9]{1,2}):([0-9]{2})")


def parse_time(text: str, *, is_end: bool = False) -> int:
    """Parse ``H:MM`` / ``HH:MM`` into minutes after midnight.

    Parameters
    ----------
    text:
        The time; hours 0-23, minutes 00-59 (exactly two digits). Surrounding whitespace
        is ignored.
    is_end:
        True for a window's ``to``: then ``24:00`` is also accepted (as 1440).

    Returns
    -------
    Minutes after midnight, 0-1439 (1440 for an end of ``24:00``).

    Raises
    ------
    ValueError
        The text is malformed or out of range; the message names the value.
    """
    if not isinstance(text, str):
        raise ValueError(f"invalid window time {text!r}: expected a string like '23:30'")
    match = _TIME_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"invalid window time {text!r}: expected H:MM or HH:MM")
    hours, minutes = int(match.group(1)), int(match.group(2))
    if hours == 24 and minutes == 0:
        if is_end:
            return MINUTES_PER_DAY
        raise ValueError(f"invalid window time {text!r}: 24:00 is only allowed as the end")
    if hours > 23:
        raise ValueError(f"invalid window time {text!r}: hours must be 0-23")
    if minutes > 59:
        raise ValueError(f"invalid window time {text!r}: minutes must be 00-59")
    return hours * 60 + minutes


def _load_zone(name: str) -> tzinfo:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"unknown timezone {name!r}")
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError) as exc:
        # ValueError: a malformed key such as '../etc/passwd' or an absolute path.
        raise ValueError(f"unknown timezone {name!r}") from exc


def _format(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@dataclass(frozen=True)
class Window:
    """A daily window; compare and hash by ``(start_min, end_min, timezone)``.

    Build one with :meth:`parse`. ``start_min`` and ``end_min`` are minutes after local
    midnight (``end_min`` may be 1440 for ``24:00``); ``timezone`` is the IANA name, or
    None for UTC.
    """

    start_min: int
    end_min: int
    timezone: str | None = None
    _zone: tzinfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Checked here too so a Window built directly (not through parse) is still sound.
        bounds = (
            ("start_min", self.start_min, MINUTES_PER_DAY - 1),
            ("end_min", self.end_min, MINUTES_PER_DAY),
        )
        for name, value, top in bounds:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= top:
                raise ValueError(f"invalid window {name} {value!r}: must be an int 0-{top}")
        zone = _dt_timezone.utc if self.timezone is None else _load_zone(self.timezone)
        object.__setattr__(self, "_zone", zone)

    @classmethod
    def parse(cls, from_: str, to: str, timezone: str | None = None) -> Window:
        """Build a window from config values.

        Parameters
        ----------
        from_:
            Opening time, ``H:MM`` or ``HH:MM`` (hours 0-23, minutes 00-59).
        to:
            Closing time, same format; ``24:00`` is also allowed.
        timezone:
            An IANA zone name (``Europe/Berlin``) for wall-clock times there; None = UTC.

        Returns
        -------
        The window.

        Raises
        ------
        ValueError
            A malformed or out-of-range time, or an unknown time zone; the message names
            the bad value.
        """
        start_min = parse_time(from_)
        end_min = parse_time(to, is_end=True)
        if timezone is not None:
            _load_zone(timezone)  # the error names the value as the operator wrote it
            timezone = timezone.strip()
        return cls(start_min, end_min, timezone)

    @property
    def always_open(self) -> bool:
        """True when the window covers the whole day (``from == to``, or ``00:00-24:00``)."""
        return self.start_min == self.end_min or (
            self.start_min == 0 and self.end_min == MINUTES_PER_DAY
        )

    def is_open(self, now: datetime) -> bool:
        """Return whether the window is open at ``now`` (minute precision).

        Parameters
        ----------
        now:
            An aware datetime (any zone; it is converted to the window's zone).

        Returns
        -------
        True inside the window.

        Raises
        ------
        ValueError
            ``now`` is naive: its zone would be a guess.
        """
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError("Window.is_open needs an aware datetime, got a naive one")
        local = now.astimezone(self._zone)
        minute = local.hour * 60 + local.minute
        if self.start_min < self.end_min:
            return self.start_min <= minute < self.end_min
        # Wraps midnight; from == to lands here and is open all day, as in CouchDB.
        return minute >= self.start_min or minute < self.end_min

    def next_open(self, now: datetime) -> datetime:
        """Return when the window next opens: ``now`` itself when it is open now.

        Parameters
        ----------
        now:
            An aware datetime.

        Returns
        -------
        An aware datetime in the window's zone, on a whole minute (``from`` of today or
        tomorrow, local time), or ``now`` when the window is open.

        Raises
        ------
        ValueError
            ``now`` is naive.
        """
        if self.is_open(now):
            return now
        local = now.astimezone(self._zone)
        # Closed means before ``from`` today or past ``to``: in both cases the next opening
        # is the next ``from``. Wall-clock arithmetic, so a DST change keeps the local time.
        opening = local.replace(hour=self.start_min // 60, minute=self.start_min % 60, second=0, microsecond=0)
        if opening <= local:
            opening += timedelta(days=1)
        return opening

    def __str__(self) -> str:
        zone = "UTC" if self.timezone is None else self.timezone
        return f"{_format(self.start_min)}-{_format(self.end_min)} {zone}"
