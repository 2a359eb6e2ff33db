"""Store errors, carrying FoundationDB's numeric error codes so retry logic is identical on every store."""

from __future__ import annotations

from smoosh.errors import SmooshError

#: FoundationDB error codes the stores raise (names as in FoundationDB's error_definitions.h).
TRANSACTION_TOO_OLD = 1007
FUTURE_VERSION = 1009
NOT_COMMITTED = 1020
COMMIT_UNKNOWN_RESULT = 1021
TRANSACTION_CANCELLED = 1025
WATCH_CANCELLED = 1029
TRANSACTION_TIMED_OUT = 1031
TOO_MANY_WATCHES = 1032
ACCESSED_UNREADABLE = 1036
PROCESS_BEHIND = 1037
DATABASE_LOCKED = 1038
CLUSTER_VERSION_CHANGED = 1039
COMMIT_PROXY_MEMORY_LIMIT_EXCEEDED = 1042
BATCH_TRANSACTION_THROTTLED = 1051
GRV_PROXY_MEMORY_LIMIT_EXCEEDED = 1078
OPERATION_CANCELLED = 1101
TAG_THROTTLED = 1213
TRANSACTION_THROTTLED_HOT_SHARD = 1235
TRANSACTION_REJECTED_RANGE_LOCKED = 1242
USED_DURING_COMMIT = 2017
INVERTED_RANGE = 2005
KEY_OUTSIDE_LEGAL_RANGE = 2004
CLIENT_INVALID_OPERATION = 2000
TRANSACTION_TOO_LARGE = 2101
KEY_TOO_LARGE = 2102
VALUE_TOO_LARGE = 2103

#: Codes after which the transaction may or may not have committed (FoundationDB's maybe_committed).
MAYBE_COMMITTED = frozenset({COMMIT_UNKNOWN_RESULT, CLUSTER_VERSION_CHANGED})

#: Codes after which the transaction certainly did not commit and may simply be run again.
RETRYABLE_NOT_COMMITTED = frozenset(
    {
        NOT_COMMITTED,
        TRANSACTION_TOO_OLD,
        FUTURE_VERSION,
        DATABASE_LOCKED,
        PROCESS_BEHIND,
        COMMIT_PROXY_MEMORY_LIMIT_EXCEEDED,
        GRV_PROXY_MEMORY_LIMIT_EXCEEDED,
        BATCH_TRANSACTION_THROTTLED,
        TAG_THROTTLED,
        TRANSACTION_THROTTLED_HOT_SHARD,
        TRANSACTION_REJECTED_RANGE_LOCKED,
    }
)

#: FoundationDB's ``retryable`` predicate (``fdb_error_predicate``).
RETRYABLE = MAYBE_COMMITTED | RETRYABLE_NOT_COMMITTED

#: What a transaction's ``on_error`` retries: the predicate's set without 1039. Only the
#: multi-version client's transactions handle ``cluster_version_changed``; libfdb_c without an
#: external client (bypass mode, smoosh's default) runs native transactions, whose ``onError``
#: raises it although the predicate calls it retryable (found on a 7.3 cluster). Every store's
#: ``on_error`` behaves so; smoosh's retry loop retries 1039 itself, on a fresh transaction.
ON_ERROR_RETRYABLE = RETRYABLE - {CLUSTER_VERSION_CHANGED}

#: What smoosh's retry loop (:meth:`~smoosh.store.base.Store.transact`) retries: FoundationDB's
#: set plus 1031, which ``on_error`` does not retry. couch_jobs retries it too: one attempt
#: that timed out (a slow commit, a stalled read) says nothing about the next. The loop hands
#: only :data:`ON_ERROR_RETRYABLE` to ``on_error``; 1031 and 1039 it retries on a fresh transaction.
LOOP_RETRYABLE = RETRYABLE | {TRANSACTION_TIMED_OUT}

#: Codes after which smoosh treats a transaction as "may have committed": FoundationDB's
#: maybe_committed set plus 1031, since a timeout can strike after the commit was sent.
OUTCOME_UNKNOWN = MAYBE_COMMITTED | {TRANSACTION_TIMED_OUT}

_DESCRIPTIONS = {
    TRANSACTION_TOO_OLD: "Transaction is too old to perform reads or be committed",
    FUTURE_VERSION: "Request for future version",
    NOT_COMMITTED: "Transaction not committed due to conflict with another transaction",
    COMMIT_UNKNOWN_RESULT: "Transaction may or may not have committed",
    TRANSACTION_CANCELLED: "Operation aborted because the transaction was cancelled",
    WATCH_CANCELLED: "Operation aborted because watch was cancelled",
    TRANSACTION_TIMED_OUT: "Operation aborted because the transaction timed out",
    TOO_MANY_WATCHES: "Too many watches currently set",
    ACCESSED_UNREADABLE: "Read or wrote an unreadable key",
    PROCESS_BEHIND: "Storage process does not have recent mutations",
    DATABASE_LOCKED: "Database is locked",
    CLUSTER_VERSION_CHANGED: "The protocol version of the cluster has changed",
    OPERATION_CANCELLED: "Asynchronous operation cancelled",
    INVERTED_RANGE: "Range begin key larger than end key",
    KEY_OUTSIDE_LEGAL_RANGE: "Key outside legal range",
    CLIENT_INVALID_OPERATION: "Invalid API call",
    USED_DURING_COMMIT: "Operation issued while a commit was outstanding",
    TRANSACTION_TOO_LARGE: "Transaction exceeds byte limit",
    KEY_TOO_LARGE: "Key length exceeds limit",
    VALUE_TOO_LARGE: "Value length exceeds limit",
}


def describe(code: int) -> str:
    """FoundationDB's description of an error code (a generic one for codes not listed)."""
    return _DESCRIPTIONS.get(code, "store error")


class StoreError(SmooshError):
    """Raised when a store operation fails; ``code`` is FoundationDB's numeric error code."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        #: The message without its code (FoundationDB's description unless one was given).
        self.detail = message or _DESCRIPTIONS.get(code, "store error")
        super().__init__(f"{self.detail} ({code})")

    @property
    def retryable(self) -> bool:
        """Whether FoundationDB's retry loop would run the transaction again after this error."""
        return self.code in RETRYABLE

    @property
    def maybe_committed(self) -> bool:
        """Whether the transaction may have committed despite the error (1021, 1031, 1039)."""
        return self.code in OUTCOME_UNKNOWN

    @property
    def loop_retryable(self) -> bool:
        """Whether smoosh's retry loop runs the transaction again (``retryable``, or 1031)."""
        return self.code in LOOP_RETRYABLE


class StoreUnavailable(SmooshError):
    """Raised when a store cannot be opened: a bad URL, a missing native client, an unreadable file."""
