"""How often this command's workers were restarted (``run.max_failures``), recorded.

Every worker-group start runs the loop from the top, so the count lives outside it: the driver
gives each command an id (``WorkerPayload.command``) and rank 0 counts the starts of that id in
``<run folder>/restarts.json`` (rewritten atomically). The first start is not a restart; each
later one is, and is said on the console and logged as the MLflow metric ``run/restarts`` at
the step resumed from, sent at once: a command killed before its next checkpoint still counts it.
Remote storage (``s3://…``) has no folder to count in: not counted.
"""

from __future__ import annotations

import json

from trainforge import log, storage
from trainforge.atomic import replacing
from trainforge.distributed import WorkerContext
from trainforge.tracking.worker import WorkerTracker

FILE = "restarts.json"


def record(
    run_dir: str, command: str, ctx: WorkerContext, tracker: WorkerTracker, step: int
) -> int:
    """On rank 0: count this start of ``command``; when it is a restart, say so and log the
    count. Returns the restarts so far (0 on other ranks and where nothing can be counted)."""
    folder = storage.local_folder(run_dir)
    if not ctx.is_main or folder is None:
        return 0
    path = folder / FILE
    try:
        before = json.loads(path.read_text())
    except (OSError, ValueError):
        before = {}
    count = before.get(command, 0) if isinstance(before, dict) else 0
    starts = {command: int(count) + 1}  # only this command's count is kept
    folder.mkdir(parents=True, exist_ok=True)
    with replacing(path) as temporary:
        temporary.write_text(json.dumps(starts) + "\n")
    restarts = starts[command] - 1
    if restarts:
        log.say(f"workers restarted ({restarts} so far, run.max_failures), resuming")
        tracker.log({"run/restarts": float(restarts)}, step)
        tracker.commit(wait=False)  # the resumed checkpoint covers it: kept if the command dies
    return restarts
