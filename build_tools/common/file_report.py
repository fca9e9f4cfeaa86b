"""The findings of a check on one release file (an sdist, a plugin wheel): each failed check with its message."""

from __future__ import annotations

from dataclasses import dataclass, field

PYPI_FILE_LIMIT_MB = 100  # PyPI's default per-file limit (a project can ask for more)


@dataclass
class FileReport:
    filename: str
    size: int
    failures: list[tuple[str, str]] = field(default_factory=list)  # (check, message)

    @property
    def ok(self) -> bool:
        return not self.failures

    def fail(self, check: str, message: str) -> None:
        self.failures.append((check, message))

    def render(self) -> str:
        head = f"{self.filename}  {self.size / 1e6:.1f} MB  {'OK' if self.ok else 'REFUSED'}"
        return "\n".join([head, *(f"  [{c}] {m}" for c, m in self.failures)])
