"""The RQ worker Surety runs: RQ's SimpleWorker (a job runs in the worker's own process, no
fork per job: the drain jobs are long and few), which registers itself again after Redis
restarted.

Redis keeps nothing on disk here (it only delivers work), so a restarted Redis has forgotten
every worker. RQ registers a worker once, when it starts; its heartbeats then go on writing to
a key no listing names, and `/healthz`, which finds workers through RQ's registry, would call
every host's workers down until each one was restarted. A heartbeat that finds its key without
a birth date (the key the heartbeat itself just made on an empty Redis) registers the worker
again first.
"""

from rq.worker import SimpleWorker


class Worker(SimpleWorker):
    def heartbeat(self, timeout=None, pipeline=None):
        # Within a pipeline (RQ's own, around a job) the check would read nothing yet.
        if pipeline is None and not self.connection.hexists(self.key, "birth"):
            self.connection.delete(self.key)
            self.register_birth()
        super().heartbeat(timeout, pipeline)
