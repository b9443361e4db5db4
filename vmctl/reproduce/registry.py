"""The papers ``vmctl reproduce`` knows: id -> module. A paper whose module is not in this build is
reported as "not available in this build" (exit 2), never with made-up claims."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from vmctl.errors import UserError, ValidationError
from vmctl.reproduce.base import Paper

#: paper id -> (module, short title); the seeds are ../shared/seeds/NNN_*.txt
PAPERS: dict[str, tuple[str, str]] = {
    "000": ("vmctl.reproduce.p000", "MEASY: EASY, KEASY, REASY and MEASY on two-tier VMs"),
    "001": ("vmctl.reproduce.p001", "task bags with deadlines and workload-dependent priority (CERIT-SC)"),
    "002": ("vmctl.reproduce.p002", "HSRET: moldable job scheduling"),
    "003": ("vmctl.reproduce.p003", "VCSCHED: resource allocation using virtual clusters"),
    "004": ("vmctl.reproduce.p004", "gang scheduling with backfilling and migration (BGS, GS+M, BGS+M)"),
}


class PaperUnavailable(UserError):
    reference = "paper-unavailable"
    template = "paper {paper} ({title}) is not available in this build (no module {module})"
    hint = "vmctl reproduce --list shows the papers this build has"


@dataclass(frozen=True, slots=True)
class Entry:
    id: str
    module: str
    title: str


def paper_id(text: str) -> str:
    """``"000"`` from ``"000"``, ``"0"`` or ``"p000"``; a clear error for anything else."""
    t = text.strip().lower().removeprefix("p")
    if t.isdigit() and len(t) <= 3 and t.zfill(3) in PAPERS:
        return t.zfill(3)
    raise ValidationError(field="PAPER", problem=f"unknown paper {text!r}; known: {', '.join(PAPERS)}")


def entry(text: str) -> Entry:
    pid = paper_id(text)
    module, title = PAPERS[pid]
    return Entry(pid, module, title)


def load(text: str) -> Paper:
    """The paper's ``PAPER`` (errors: unknown id -> ValidationError; module missing -> PaperUnavailable)."""
    e = entry(text)
    try:
        mod = importlib.import_module(e.module)
    except ModuleNotFoundError as exc:
        if exc.name != e.module:
            raise
        raise PaperUnavailable(paper=e.id, title=e.title, module=e.module) from exc
    paper = getattr(mod, "PAPER", None)
    if not isinstance(paper, Paper) or paper.id != e.id:
        raise TypeError(f"{e.module} must define PAPER = Paper(id={e.id!r}, ...)")
    return paper


def available(text: str) -> Paper | None:
    try:
        return load(text)
    except PaperUnavailable:
        return None
