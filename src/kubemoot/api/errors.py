"""Errors about user input.

Every error a user can cause with a file, a flag or a resource is an :class:`InputError`.
It carries where the problem is (file, document index, kind/name, field path) so the
message can name it; the CLI turns it into exit status 2 without a traceback.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input from a user: a malformed resource, a wrong operator, a bad CLI file."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        document: int | None = None,
        kind: str | None = None,
        name: str | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = file
        self.document = document
        self.kind = kind
        self.name = name
        self.field = field
        super().__init__(self.describe())

    def describe(self) -> str:
        """One line: ``FILE, document N (0-based), Kind/name, field a.b[0].c: message``."""
        where: list[str] = []
        if self.file is not None:
            where.append(self.file)
        if self.document is not None:
            # Documents are counted from 0, as kubectl and yq count them; say so.
            where.append(f"document {self.document} (0-based)")
        if self.kind or self.name:
            where.append(f"{self.kind or '?'}/{self.name or '?'}")
        if self.field:
            where.append(f"field {self.field}")
        prefix = ", ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message
