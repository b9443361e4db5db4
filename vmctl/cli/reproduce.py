"""``vmctl reproduce``: a paper's headline claims beside ours (vmctl/reproduce/, docs/reproduction.md)."""

from __future__ import annotations

import os
import shlex

import click

from vmctl.errors import ValidationError


@click.command("reproduce")
@click.argument("targets", nargs=-1, metavar="PAPER | --docs DIR...")
@click.option("--quick/--full", "quick", default=True, show_default=True,
              help="quick: <= 15 min on 2 cores (says what it reduced); full: the paper's size or the largest "
                   "this machine does (prints its estimated time first)")
@click.option("--out", "out", type=click.Path(file_okay=False), help="output directory (tables, claims.md, "
              "claims.parquet); a rerun resumes from it")
@click.option("--workers", type=click.IntRange(min=1), default=None, help="local Dask workers (default: one per core)")
@click.option("--scheduler", default=None, help="an existing Dask cluster: tcp://HOST:PORT or a scheduler file")
@click.option("--list", "list_", is_flag=True, help="list the claims (of PAPER, or of every paper) and exit")
@click.option("--docs", is_flag=True, help="print docs/reproduction.md built from DIR/claims.parquet of each DIR")
@click.option("--no-progress", is_flag=True, help="no progress bars on stderr")
def reproduce(targets: tuple[str, ...], quick: bool, out: str | None, workers: int | None, scheduler: str | None,
              list_: bool, docs: bool, no_progress: bool) -> None:
    """Rerun a paper's headline experiments and put every claim beside ours: PAPER is 000 ... 004.

    \b
    vmctl reproduce --list                      every paper and its claims
    vmctl reproduce 000 --quick --out runs/000  run, resume when rerun; writes claims.md, claims.parquet
    vmctl reproduce --docs runs/000 runs/003 > docs/reproduction.md
    """
    from vmctl.reproduce import registry

    if docs:
        if not targets:
            raise ValidationError(field="--docs", problem="give the output directories of vmctl reproduce runs")
        from vmctl.reproduce.docs import reproduction_markdown

        click.echo(reproduction_markdown(targets), nl=False)
        return
    if len(targets) > 1:
        raise ValidationError(field="PAPER", problem=f"give one paper, not {len(targets)} ({' '.join(targets)})")
    if list_:
        ids = [registry.paper_id(targets[0])] if targets else list(registry.PAPERS)
        for pid in ids:
            _list_paper(pid, single=bool(targets))
        return
    if not targets:
        raise ValidationError(field="PAPER", problem=f"which paper? one of {', '.join(registry.PAPERS)} (or --list)")
    if out is None:
        raise ValidationError(field="--out", problem="give the output directory (--out DIR)")
    from vmctl.experiments.runner import writable_dir

    registry.paper_id(targets[0])
    writable_dir(out)
    paper = registry.load(targets[0])
    mode = "quick" if quick else "full"
    size = paper.size(mode)
    from vmctl.reproduce.run import estimate_s
    from vmctl.reproduce.run import reproduce as run_paper

    n = workers or (os.cpu_count() or 1)
    where = f"the cluster at {scheduler}" if scheduler else f"{n} local worker(s)"
    click.echo(f"paper {paper.id} ({paper.title}), {mode}: {size.description}", err=True)
    if size.reduced:
        click.echo(f"reduced from the paper's size: {size.reduced}", err=True)
    est = estimate_s(size, n)
    click.echo(f"estimated time from scratch: {_duration(est)} on {where} (cells already in {out} are not run "
               "again)", err=True)
    command = "vmctl reproduce " + " ".join(shlex.quote(a) for a in [paper.id, f"--{mode}", "--out", out])
    res = run_paper(paper, mode, out, workers=workers, scheduler=scheduler, command=command,
                    progress=not no_progress, say=lambda s: click.echo(s, err=True))
    for r in res.rows:
        click.echo(f"{r['claim']:>7}  {r['verdict']:<12}  paper {r['paper_value']}  ours {r['ours']}")
    click.echo(f"wrote {os.path.join(out, 'claims.md')} and claims.parquet in {res.wall_s:.0f} s", err=True)


def _duration(s: float) -> str:
    return f"{s / 60:.0f} min" if s >= 90 else f"{s:.0f} s"


def _list_paper(pid: str, single: bool) -> None:
    from vmctl.reproduce import registry

    entry = registry.entry(pid)
    paper = registry.available(pid)
    if paper is None:
        click.echo(f"{pid}  {entry.title}: not available in this build")
        if single:
            raise registry.PaperUnavailable(paper=entry.id, title=entry.title, module=entry.module)
        return
    click.echo(f"{pid}  {paper.title}")
    for name, s in paper.sizes.items():
        click.echo(f"       --{name} (estimated {_duration(s.est_cpu_s / 2)} on 2 workers): {s.description}"
                   + (f" (reduced: {s.reduced})" if s.reduced else ""))
    for c in paper.claims:
        click.echo(f"  {c.id:>7}  {c.text} ({c.where}; paper: {c.paper})")
