"""The error tree. Every error the package raises on purpose derives from
:class:`EtcdschedError`; the API maps these to HTTP statuses in one place."""

from __future__ import annotations


class EtcdschedError(Exception):
    """Base of every deliberate etcdsched error.

    ``code`` is the stable machine-readable name clients see in
    ``{"error": {"code": ...}}``; ``field`` names the input field at fault.
    """

    code = "error"
    http_status = 500

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(EtcdschedError):
    """The caller sent something we cannot accept (HTTP 400/422)."""

    code = "invalid_input"
    http_status = 422


class NotFound(EtcdschedError):
    """The named job, run or member does not exist (or is not visible to you)."""

    code = "not_found"
    http_status = 404


class Conflict(EtcdschedError):
    """A compare failed: someone else changed the record first (HTTP 409)."""

    code = "conflict"
    http_status = 409


class InvalidTransition(Conflict):
    """A run state change not allowed by the state machine."""

    code = "invalid_transition"


class OwnershipLost(EtcdschedError):
    """This process no longer owns the partition (or claim) it tried to write under.

    Raised when a fencing compare fails; the caller must stop acting for that
    partition and let the new owner take over.
    """

    code = "ownership_lost"
    http_status = 409


class StoreUnavailable(EtcdschedError):
    """etcd could not be reached; nothing was written."""

    code = "store_unavailable"
    http_status = 503


class OutcomeUnknown(StoreUnavailable):
    """A write was sent but its result never came back: it may or may not have
    been applied. Re-read before acting; never assume either way."""

    code = "outcome_unknown"


class StoreRejected(EtcdschedError):
    """etcd refused the request itself (too large, malformed): nothing applied."""

    code = "store_rejected"
    http_status = 500


class Unauthorized(EtcdschedError):
    """Missing or unknown bearer token (HTTP 401)."""

    code = "unauthorized"
    http_status = 401


class Forbidden(EtcdschedError):
    """The token is valid but its role may not do this (HTTP 403)."""

    code = "forbidden"
    http_status = 403


class QuotaExceeded(EtcdschedError):
    """A tenant limit was hit (HTTP 429); ``retry_after`` is in seconds."""

    code = "quota_exceeded"
    http_status = 429

    def __init__(self, message: str, *, retry_after: float, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.retry_after = retry_after


class PayloadTooLarge(EtcdschedError):
    """A request body over the configured bound (HTTP 413)."""

    code = "payload_too_large"
    http_status = 413


class PreconditionRequired(EtcdschedError):
    """A write that must say which version it is based on did not (HTTP 428):
    a replace without ``If-Match`` would silently undo a change it never saw."""

    code = "precondition_required"
    http_status = 428
