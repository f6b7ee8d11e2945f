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

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console


class JobError(Exception):
    """Wrong arguments or a broken shared volume; one line, exit status 2."""


def add_parser(s: Any) -> None:
    j = s.add_parser(
        "job",
        help="one pod of an Indexed Job: run a shard; the last to finish merges, derives, updates",
        description="Run after '--' the same arguments as 'ceiling sweep run' (without --out, "
        "--shard, --resume).",
    )
    j.add_argument("--root", required=True, help="the volume every shard pod mounts")
    j.add_argument(
        "--run-id",
        default=os.environ.get("JOB_NAME"),
        help="one directory per sweep under --root (default $JOB_NAME: the Job's name)",
    )
    j.add_argument(
        "--index",
        type=int,
        default=_env_int("JOB_COMPLETION_INDEX"),
        help="this pod's shard (default $JOB_COMPLETION_INDEX)",
    )
    j.add_argument("--shards", type=int, required=True, help="the Job's completions")
    j.add_argument("--model-label", required=True, help="the sidecar registry label to derive for")
    j.add_argument("--workload", default="default")
    j.add_argument("--mode", choices=["off", "observe", "enforce"])
    j.add_argument(
        "--configmap",
        metavar="NAME[/KEY]",
        help="update this ceilings ConfigMap (service account: get + patch on it)",
    )
    j.add_argument("--namespace", help="the ConfigMap's namespace (default: the pod's)")
    j.add_argument(
        "--accept-unresolved",
        action="store_true",
        help="derive even when the deciding interval is wider than the tolerance",
    )
    j.add_argument("run_args", nargs=argparse.REMAINDER, help="-- then 'sweep run' arguments")


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    return int(v) if v and v.isdigit() else None


def run(args: argparse.Namespace, console: Console, cli: Callable[[Sequence[str]], int]) -> int:
    """``cli`` is ``ceiling``'s own entry point: each step is the same command a user would type."""
    run_args = [a for a in args.run_args if a != "--"] if args.run_args else []
    for flag in ("--out", "--shard", "--resume", "--refine"):
        if any(a == flag or a.startswith(flag + "=") for a in run_args):
            raise JobError(f"{flag} is set by the job itself; leave it out of the run arguments")
    if not args.run_id:
        raise JobError("--run-id is required (or $JOB_NAME from the Job's downward API)")
    if args.index is None:
        raise JobError("--index is required (or $JOB_COMPLETION_INDEX: use completionMode Indexed)")
    if not 0 <= args.index < args.shards:
        raise JobError(f"index {args.index} is outside 0..{args.shards - 1}")
    root = Path(args.root)
    if not root.is_dir():
        raise JobError(f"{root}: the shared volume is not mounted")
    run_dir = root / args.run_id
    shard = run_dir / f"shard-{args.index}"
    done = shard / "shard.done"
    if not done.exists():
        resume = ["--resume"] if (shard / "plan.json").exists() else []
        code = cli(
            [
                "sweep",
                "run",
                *run_args,
                *resume,
                "--shard",
                f"{args.index}/{args.shards}",
                "--out",
                str(shard),
                "--no-progress",
            ]
        )
        if code != 0:
            return code  # the pod fails; the Job retries this index, which resumes the shard
        done.touch()
    shards = [run_dir / f"shard-{k}" for k in range(args.shards)]
    finished = [s for s in shards if (s / "shard.done").exists()]
    if len(finished) < len(shards):
        console.print(
            f"shard {args.index} done; {len(finished)} of {len(shards)} finished; "
            "the last one to finish merges"
        )
        return 0
    if (run_dir / "finalized").exists():
        console.print(f"{run_dir}: already finalized")
        return 0
    if not _claim(run_dir / "finalize.lock", args.index):
        console.print(f"shard {args.index} done; another shard is finalizing {run_dir}")
        return 0
    merged = run_dir / "merged"
    code = cli(["sweep", "merge", str(merged), *map(str, shards)])
    if code != 0:
        return code
    derive = ["sweep", "derive", str(merged), "--model", args.model_label]
    derive += ["--workload", args.workload] + (["--mode", args.mode] if args.mode else [])
    derive += ["--accept-unresolved"] if args.accept_unresolved else []
    if args.configmap:
        # derive on top of what is live, so the new document keeps every other entry and has the
        # next version; the update below is conditional on that same live version
        live = _live_document(args.configmap, args.namespace, run_dir)
        if live is not None:
            derive += ["--merge", str(live)]
    code = cli(derive)
    if code != 0:
        return code
    if args.configmap:
        push = ["push", str(merged / "ceilings.yaml"), "--to-configmap", args.configmap]
        code = cli(push + (["--namespace", args.namespace] if args.namespace else []))
        if code != 0:
            return code
    (run_dir / "finalized").touch()
    console.print(f"[bold green]sweep {args.run_id} finalized[/]: {merged / 'ceilings.yaml'}")
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


def _live_document(target: str, namespace: str | None, run_dir: Path) -> Path | None:
    from context_ceiling.core.kube import Cluster, ConfigMaps, KubeError, split_target

    name, key = split_target(target)
    try:
        with ConfigMaps(Cluster.in_cluster(namespace)) as cms:
            text = cms.get(name).data.get(key, "")
    except KubeError as exc:
        raise JobError(str(exc)) from exc
    if not text.strip():
        return None
    path = run_dir / "live-ceilings.yaml"
    path.write_text(text)
    return path
