"""Errors the advice service raises; api/ maps them to HTTP statuses, the CLI to messages."""


class AdvisorError(Exception):
    """Base class for the advice service's errors; the message says what to do."""


class InvalidRequest(AdvisorError):
    """A destination, budget, probe level or other input is malformed or out of range."""


class DestinationNotAllowed(AdvisorError):
    """A probe was aimed at an address outside the operator's allow-list."""


class WrongSite(AdvisorError):
    """A site's token (TAME_SITE_TOKENS) was used to write for another site's links, or without naming its site."""


class UnknownDestination(AdvisorError):
    """No fit is stored for the destination yet."""


class UnknownProbe(AdvisorError):
    """No probe job has the requested id."""


class StoreError(AdvisorError):
    """The advice store failed (database unreachable, schema too new, ...)."""


class ConfigError(AdvisorError):
    """An environment setting is malformed; raised once at start-up."""


class DuplicateKey(InvalidRequest):
    """A JSON document gives one key twice in an object (JSON parsers keep one of the two, silently)."""


class TooManyLinks(InvalidRequest):
    """A write would make a new link from a site that has as many links as the service keeps for one site."""


class TooManySites(InvalidRequest):
    """A write would make a new site when the store holds as many sites as the service keeps."""


class TooManyControls(InvalidRequest):
    """A write would add a congestion control to a link that holds as many as the service keeps for one link."""


class BatchTooLarge(InvalidRequest):
    """A batch request holds more items than the service accepts in one call."""


class BudgetConflict(AdvisorError):
    """An agent registered its site with a budget other than the one the site's live agents run with."""


class RetryLater(AdvisorError):
    """The service cannot do it now, through no fault of the request; ``retry_after_s`` says when to ask again."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueFull(RetryLater):
    """The probe queue holds as many jobs as the service accepts."""


class LookupUnfinished(RetryLater):
    """A destination's name lookup did not finish (advisor.allowlist.system_resolver): nothing is known against the
    destination, so the request (or the probe job) is to be tried again later, not refused."""


class LookupsBusy(LookupUnfinished):
    """A destination's name was not looked up at all: every lookup slot stayed taken for RESOLVE_TIMEOUT_S, or no
    thread could be started for it."""


class LookupTimedOut(LookupUnfinished):
    """A name that did not resolve within RESOLVE_TIMEOUT_S (its servers slow, or silent)."""
