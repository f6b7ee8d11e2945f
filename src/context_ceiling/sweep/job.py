"""``ceiling sweep job``: one pod of an Indexed Kubernetes Job, and the last one out finalizes.

Kubernetes runs N pods with ``JOB_COMPLETION_INDEX`` 0..N-1 and has no step that runs after them,
so each pod runs its shard into a shared volume (``ROOT/RUN_ID/shard-I``, resumed if a retried pod
finds it), marks it done, and looks at the others. The pod that sees every shard done claims the
finalize step with an exclusive create of ``finalize.lock`` (so two pods finishing together do not
both write), merges the shards, derives the ceiling on top of the live document, and updates the
ceilings ConfigMap, conditional on the version it read. A pod that retries after dying mid-finalize
owns the lock by its index and finishes the job; anything it already did is repeated harmlessly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from context_ceiling.ceilings.kube import Cluster, ConfigMaps, split_target
from context_ceiling.ceilings.push import push
from context_ceiling.core.errors import UserError
from context_ceiling.core.vocabulary import Mode
from context_ceiling.sweep.derive import DeriveOptions, derive
from context_ceiling.sweep.merge import merge
from context_ceiling.sweep.run import RunOptions, run


class JobError(UserError):
    """Wrong arguments or a broken shared volume; one line, exit status 2."""


@dataclass(frozen=True)
class JobOptions:
    root: str
    shards: int
    model_label: str
    run_id: str | None = None
    index: int | None = None
    workload: str = "default"
    mode: Mode | None = None
    configmap: str | None = None  # NAME[/KEY] of the ceilings ConfigMap to update
    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    accept_unresolved: bool = False


def run_job(job: JobOptions, sweep: RunOptions, console: Console) -> int:
    """Run this pod's shard of ``sweep``; the last pod to finish merges, derives and updates."""
    own = {"--out": sweep.out, "--shard": sweep.shard, "--resume": sweep.resume}
    own["--refine"] = sweep.refine
    for flag, value in own.items():
        if value:
            raise JobError(f"{flag} is set by the job itself; leave it out of the run arguments")
    if not job.run_id:
        raise JobError("--run-id is required (or $JOB_NAME from the Job's downward API)")
    if job.index is None:
        raise JobError("--index is required (or $JOB_COMPLETION_INDEX: use completionMode Indexed)")
    if not 0 <= job.index < job.shards:
        raise JobError(f"index {job.index} is outside 0..{job.shards - 1}")
    root = Path(job.root)
    if not root.is_dir():
        raise JobError(f"{root}: the shared volume is not mounted")
    run_dir = root / job.run_id
    shard = run_dir / f"shard-{job.index}"
    done = shard / "shard.done"
    if not done.exists():
        mine = sweep.model_copy(
            update={
                "resume": (shard / "plan.json").exists(),
                "shard": f"{job.index}/{job.shards}",
                "out": str(shard),
                "no_progress": True,
            }
        )
        code = run(mine, console)
        if code != 0:
            return code  # the pod fails; the Job retries this index, which resumes the shard
        done.touch()
    shards = [run_dir / f"shard-{k}" for k in range(job.shards)]
    finished = [s for s in shards if (s / "shard.done").exists()]
    if len(finished) < len(shards):
        console.print(
            f"shard {job.index} done; {len(finished)} of {len(shards)} finished; "
            "the last one to finish merges"
        )
        return 0
    if (run_dir / "finalized").exists():
        console.print(f"{run_dir}: already finalized")
        return 0
    if not _claim(run_dir / "finalize.lock", job.index):
        console.print(f"shard {job.index} done; another shard is finalizing {run_dir}")
        return 0
    return _finalize(job, run_dir, shards, console)


def _finalize(job: JobOptions, run_dir: Path, shards: list[Path], console: Console) -> int:
    merged = run_dir / "merged"
    code = merge(merged, shards, console)
    if code != 0:
        return code
    # derive on top of what is live, so the new document keeps every other entry and has the
    # next version; the update below is conditional on that same live version
    live = _live_document(job, run_dir) if job.configmap else None
    code = derive(
        DeriveOptions(
            run=str(merged),
            model=job.model_label,
            workload=job.workload,
            mode=job.mode,
            accept_unresolved=job.accept_unresolved,
            merge=str(live) if live else None,
        ),
        console,
    )
    if code != 0:
        return code
    if job.configmap:
        lines = push(
            str(merged / "ceilings.yaml"),
            [],
            None,
            configmap=job.configmap,
            namespace=job.namespace,
            kubeconfig=job.kubeconfig,
            context=job.context,
        )
        console.print("\n".join(lines))
    (run_dir / "finalized").touch()
    console.print(f"[bold green]sweep {job.run_id} finalized[/]: {merged / 'ceilings.yaml'}")
    return 0


def _claim(lock: Path, index: int) -> bool:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        # ours if this very index claimed it before its pod died
        return lock.read_text().strip() == str(index)
    with os.fdopen(fd, "w") as f:
        f.write(str(index))
    return True


def _live_document(job: JobOptions, run_dir: Path) -> Path | None:
    assert job.configmap is not None
    name, key = split_target(job.configmap)
    with ConfigMaps(Cluster.resolve(job.namespace, job.kubeconfig, job.context)) as cms:
        text = cms.get(name).data.get(key, "")
    if not text.strip():
        return None
    path = run_dir / "live-ceilings.yaml"
    path.write_text(text)
    return path
