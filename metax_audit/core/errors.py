# One root exception for "could not audit" (exit code 2), one subclass per stage, each
# message saying what to do next; the CLI maps them to a one-line error.
from __future__ import annotations


class AuditError(Exception):
    """metax-audit could not audit: bad input or a broken target environment (exit 2)."""


class ConfigError(AuditError):
    pass


class SnapshotError(AuditError):
    pass


class DiscoverError(AuditError):
    pass


class UpstreamError(AuditError):
    pass


class IntrospectError(AuditError):
    pass


class ProbeError(AuditError):
    pass


class ReportError(AuditError):
    pass


class SubprocessError(AuditError):
    """A helper process failed or timed out; carries its stderr for the evidence."""

    def __init__(self, message: str, *, stderr: str = "", returncode: int | None = None) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.returncode = returncode


class StackBindingError(AuditError):
    """Pinned kernel packages that could not be bound and were not accepted (allow-unbound): the review would
    leave every call into them unchecked, so it is incomplete. One line per package, each with the ways out."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = tuple(lines)
