"""Rebuild ``testkit/data/trajectories`` from the public trajectories it was made from, or
convert more of them for ``python -m benchmarks.agent_trajectories --data DIR``.

``python -m devtools.trajectory_data mini-swe-agent REPO_DIR COMMIT PATH [PATH ...]``, the same
with ``swe-agent``, or
``python -m devtools.trajectory_data tau-bench REPO_DIR COMMIT PATH --pick N [--task ID ...]``:
reads each file at that commit of a local clone (``git show``), converts it to the neutral form
of ``testkit.traffic.trajectories`` and writes it gzipped with its source, into ``--out``
(default: the shipped set). A mini-swe-agent ``PATH`` that is a folder stands for every
``*.traj.json`` under it, a SWE-agent one for every ``*.traj``; ``--min-turns T`` keeps those
with at least T model turns, and ``--sample N --seed S`` takes N mini-swe-agent runs at random.
``--pick N`` takes the N longest conversations of a tau-bench file (ties by task id), one per
task; ``--task ID`` adds the longest conversation of that task (shorter conversations, whose
system prompt is a larger share of the ceiling).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import subprocess
from pathlib import Path

from testkit.traffic.trajectories import (
    DATA,
    Trajectory,
    from_mini_swe_agent,
    from_swe_agent,
    from_tau_bench,
)

REPOS = {
    "mini-swe-agent": ("gruckion/mini-swe-agent", "MIT"),
    "swe-agent": ("SWE-agent/SWE-agent", "MIT"),
    "tau-bench": ("sierra-research/tau-bench", "MIT"),
}
#: what a SWE-agent trajectory's name keeps of its path: not the folders every one shares, nor
#: the sampling settings in a run folder's name
_SWE_NOISE = re.compile(r"^(trajectories/demonstrations|tests/test_data/trajectories)/|__t-[^/]*")


def _write(out: Path, t: Trajectory) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"name": t.name, "framework": t.framework, "source": t.source, "messages": t.messages}
    with gzip.GzipFile(out / f"{t.name}.json.gz", "wb", mtime=0) as f:
        f.write(json.dumps(doc, ensure_ascii=False, sort_keys=True).encode())


def _git(repo_dir: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo_dir), *args], check=True, capture_output=True, text=True
    ).stdout


def _files(args: argparse.Namespace, suffix: str) -> list[str]:
    """The ``PATH`` arguments at the commit: a file as given, a folder as every file under it
    whose name ends with ``suffix``."""
    paths: list[str] = []
    for path in args.paths:
        listed = _git(args.repo_dir, "ls-tree", "-r", "--name-only", args.commit, path).split()
        paths += [p for p in listed if p.endswith(suffix)] if listed != [path] else [path]
    return paths


def _mini_swe_agent(args: argparse.Namespace, source: dict[str, str]) -> list[Trajectory]:
    paths = _files(args, ".traj.json")
    if args.sample is not None:
        random.Random(args.seed).shuffle(paths)
    out: list[Trajectory] = []
    for path in paths:
        if args.sample is not None and len(out) == args.sample:
            break
        raw = json.loads(_git(args.repo_dir, "show", f"{args.commit}:{path}"))
        name = "mini-swe-agent-" + Path(path).name.removesuffix(".traj.json")
        t = from_mini_swe_agent(raw, name, {**source, "path": path})
        if t.model_turns >= args.min_turns:
            out.append(t)
    return out


def _swe_agent(args: argparse.Namespace, source: dict[str, str]) -> list[Trajectory]:
    out: list[Trajectory] = []
    for path in sorted(_files(args, ".traj")):
        raw = json.loads(_git(args.repo_dir, "show", f"{args.commit}:{path}"))
        stem = Path(path).stem
        short = _SWE_NOISE.sub("", path.removesuffix(".traj")).replace(f"{stem}__", "", 1)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", short)
        t = from_swe_agent(raw, f"swe-agent-{slug}", {**source, "path": path})
        if t.model_turns >= args.min_turns:
            out.append(t)
    return out


def _tau_bench(args: argparse.Namespace, source: dict[str, str]) -> list[Trajectory]:
    out: list[Trajectory] = []
    for path in args.paths:
        raw = json.loads(_git(args.repo_dir, "show", f"{args.commit}:{path}"))
        ranked = sorted(raw, key=lambda e: (-len(e["traj"]), e["task_id"], e["trial"]))
        seen: set[int] = set()
        longest = 0
        for e in ranked:
            if e["task_id"] in seen:
                continue
            if longest < args.pick or e["task_id"] in args.task:
                longest += longest < args.pick
                seen.add(e["task_id"])
                name = f"tau-bench-airline-task{e['task_id']}"
                where = {**source, "path": path, "task_id": str(e["task_id"])}
                out.append(from_tau_bench(e, name, where))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("framework", choices=sorted(REPOS))
    ap.add_argument("repo_dir", type=Path)
    ap.add_argument("commit")
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--pick", type=int, default=5)
    ap.add_argument("--task", type=int, action="append", default=[])
    ap.add_argument("--sample", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-turns", type=int, default=0)
    ap.add_argument("--out", type=Path, default=DATA)
    args = ap.parse_args()
    repo, licence = REPOS[args.framework]
    source = {"repository": repo, "commit": args.commit, "licence": licence}
    convert = {"mini-swe-agent": _mini_swe_agent, "swe-agent": _swe_agent}.get(
        args.framework, _tau_bench
    )
    for t in convert(args, source):
        _write(args.out, t)


if __name__ == "__main__":
    main()
