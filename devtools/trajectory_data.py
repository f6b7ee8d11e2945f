"""Rebuild ``testkit/data/trajectories`` from the public trajectories it was made from.

``python -m devtools.trajectory_data mini-swe-agent REPO_DIR COMMIT PATH [PATH ...]`` or
``python -m devtools.trajectory_data tau-bench REPO_DIR COMMIT PATH --pick N``: reads each file
at that commit of a local clone (``git show``), converts it to the neutral form of
``testkit.traffic.trajectories`` and writes it gzipped with its source. ``--pick N`` takes the N
longest conversations of a tau-bench file (ties by task id).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

from testkit.traffic.trajectories import DATA, from_mini_swe_agent, from_tau_bench

REPOS = {
    "mini-swe-agent": ("gruckion/mini-swe-agent", "MIT"),
    "tau-bench": ("sierra-research/tau-bench", "MIT"),
}


def _write(name: str, framework: str, source: dict[str, str], messages: list[Any]) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    doc = {"name": name, "framework": framework, "source": source, "messages": messages}
    with gzip.GzipFile(DATA / f"{name}.json.gz", "wb", mtime=0) as f:
        f.write(json.dumps(doc, ensure_ascii=False, sort_keys=True).encode())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("framework", choices=sorted(REPOS))
    ap.add_argument("repo_dir", type=Path)
    ap.add_argument("commit")
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--pick", type=int, default=5)
    args = ap.parse_args()
    repo, licence = REPOS[args.framework]
    for path in args.paths:
        raw = json.loads(
            subprocess.run(
                ["git", "-C", str(args.repo_dir), "show", f"{args.commit}:{path}"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        source = {"repository": repo, "commit": args.commit, "path": path, "licence": licence}
        if args.framework == "mini-swe-agent":
            name = "mini-swe-agent-" + Path(path).name.removesuffix(".traj.json")
            t = from_mini_swe_agent(raw, name, source)
            _write(t.name, t.framework, t.source, t.messages)
            continue
        ranked = sorted(raw, key=lambda e: (-len(e["traj"]), e["task_id"], e["trial"]))
        seen: set[int] = set()
        for e in ranked:
            if len(seen) == args.pick:
                break
            if e["task_id"] in seen:
                continue
            seen.add(e["task_id"])
            name = f"tau-bench-airline-task{e['task_id']}"
            t = from_tau_bench(e, name, {**source, "task_id": str(e["task_id"])})
            _write(t.name, t.framework, t.source, t.messages)


if __name__ == "__main__":
    main()
