"""The one wait of the project: a named condition, polled until it holds or its time is up.

``until(name, probe, done, timeout)`` calls ``probe()`` every ``interval`` seconds until ``done(value)`` is true
and returns that value.  When time is up it raises ``WaitTimeout`` naming the wait and the last value it saw,
so a failure message says what was awaited and how far it got.  Exceptions of ``probe`` propagate, except
those ``retry_on`` names (e.g. a dropped connection), which count as "not yet".
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

from tenacity import RetryError, Retrying, retry_if_exception, retry_if_result, stop_after_delay, wait_fixed

from .signals import check_cancelled, wakeup

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A named wait ran out of time; says what it waited for and what it last saw."""

    def __init__(self, message: str, last: Any = None):
        super().__init__(message)
        self.last = last


def until(name: str, probe: Callable[[], T], done: Callable[[T], bool] = bool, timeout: float = 60.0,
          interval: float = 0.05, describe: Callable[[T], str] = repr,
          retry_on: Callable[[BaseException], bool] | None = None) -> T:
    last: list = [None]

    def attempt() -> T:
        check_cancelled()          # a thread told to stop (drills.core.signals.cancel_threads) stops here
        value = probe()
        last[0] = value
        return value

    retry = retry_if_result(lambda v: not done(v))
    if retry_on is not None:
        retry = retry | retry_if_exception(retry_on)
    try:
        return Retrying(retry=retry, stop=stop_after_delay(timeout), wait=wait_fixed(interval))(attempt)
    except RetryError:
        shown = describe(last[0]) if last[0] is not None else "nothing yet"
        raise WaitTimeout(f"timed out after {timeout:g}s waiting for {name}; last seen: {shown}", last[0]) from None


def hold_for(seconds: float, why: str) -> None:
    """An evidence window (not a wait for a condition): the caller's recording goes on for ``seconds``.
    ``why`` names it where it is used; the window itself is a named constant of the caller."""
    if seconds > 0:
        wakeup().wait(seconds)     # ends early in a thread told to stop, which then stops
        check_cancelled()
