"""The RQ worker Surety runs: RQ's SimpleWorker (a job runs in the worker's own process, no
fork per job: the drain jobs are long and few), which registers itself again after Redis
restarted, and waits for a Redis that went away between jobs instead of quitting.

Redis keeps nothing on disk here (it only delivers work), so a restarted Redis has forgotten
every worker. RQ registers a worker once, when it starts; its heartbeats then go on writing to
a key no listing names, and `/healthz`, which finds workers through RQ's registry, would call
every host's workers down until each one was restarted. A heartbeat that finds its key without
a birth date (the key the heartbeat itself just made on an empty Redis) registers the worker
again first.

RQ waits for Redis only while it waits for a job: a connection error, a timeout or a refused
write (a full Redis, a replica: ledger.outages.REDIS_UNREACHABLE) in its other calls (the
bookkeeping as it takes a job and as a job succeeds, the job's heartbeat as it ends, the
worker's heartbeat after a job, the suspension check, its maintenance, the state it sets
before it listens) ends the worker. A drain job runs for up to a minute, so a Redis restart while one ran was met as it
ended, and the worker quit, leaving the host one worker short until something restarted it.
These calls wait for Redis instead, unless the worker was asked to stop meanwhile (a
deployment's stop must not wait for Redis). Each is one pipeline, sent whole or not at all, so
sending it again is safe. (A failed job's bookkeeping already goes on without Redis.) The
scheduler, a process of the worker's that a Redis restart ends, is started again at the
loop's next turn rather than at RQ's next maintenance, up to ten minutes later.

The jobs that run on the worker's own thread (an alert's delivery, a reconciliation's finish, a
bulk redrive, a replay run; the drain jobs run in lanes of their own) share that thread's
persistent connection to the database. Django checks and replaces such a connection only where
it is told a unit of work begins or ends (`close_old_connections`, which it calls around each
request): without that, a connection the database ended between jobs (a failover, a restarted
pooler) failed the next job, and, broken and never closed, every job after it until the worker
was restarted. So it is called around each job here too.
"""

import time
from functools import partial

from rq.worker import SimpleWorker

from .outages import REDIS_UNREACHABLE, close_broken_connection

REDIS_WAIT_MAX_SECONDS = 30


class Worker(SimpleWorker):
    def perform_job(self, job, queue):
        close_broken_connection()  # a connection that died, or grew old, since the last job
        try:
            return super().perform_job(job, queue)
        finally:
            close_broken_connection()

    def prepare_execution(self, job):
        return self._until_redis_answers(partial(super().prepare_execution, job))

    def prepare_job_execution(self, job, *args, **kwargs):
        return self._until_redis_answers(partial(super().prepare_job_execution, job, *args, **kwargs))

    def handle_job_success(self, job, queue, started_job_registry):
        return self._until_redis_answers(partial(super().handle_job_success, job, queue, started_job_registry))

    def check_for_suspension(self, burst):
        return self._until_redis_answers(partial(super().check_for_suspension, burst))

    def handle_execution_ended(self, job, queue, heartbeat_ttl):
        return self._until_redis_answers(partial(super().handle_execution_ended, job, queue, heartbeat_ttl))

    def set_state(self, state, pipeline=None):
        if pipeline is not None:
            return super().set_state(state, pipeline)
        return self._until_redis_answers(partial(super().set_state, state))

    def heartbeat(self, timeout=None, pipeline=None):
        if pipeline is not None:  # within RQ's own pipeline around a job: nothing is sent yet
            return super().heartbeat(timeout, pipeline)
        return self._until_redis_answers(partial(self._heartbeat_registered, timeout))

    def _heartbeat_registered(self, timeout):
        if not self.connection.hexists(self.key, "birth"):
            self.connection.delete(self.key)
            self.register_birth()
        super().heartbeat(timeout)

    @property
    def should_run_maintenance_tasks(self):
        """RQ's maintenance (every ten minutes) also restarts the scheduler, whose process a Redis
        restart ends (its loop survives no connection error): until then the rings scheduled for
        later (a retry's backoff) wait for the sweeper's. So it runs at the loop's next turn once
        the scheduler this worker started has died."""
        if self._stop_requested:  # a stopping worker starts no scheduler (its teardown would kill it)
            return False
        process = getattr(self.scheduler, "_process", None)  # None: none started here, or another worker's runs
        return super().should_run_maintenance_tasks or (process is not None and not process.is_alive())

    def run_maintenance_tasks(self):
        # Between jobs RQ's loop ends the worker on any error here (it waits for Redis only
        # inside its wait for a job); taking the scheduler's lock and cleaning the registries
        # may both be done again.
        self._until_redis_answers(super().run_maintenance_tasks)
        process = getattr(self.scheduler, "_process", None)
        if process is not None and not process.is_alive():
            # RQ looks at the scheduler only once its first maintenance has cleaned the
            # registries (it has just started one): a scheduler that an outage during that first
            # maintenance ended would wait ten minutes. So it is looked at here too.
            self._until_redis_answers(partial(self.scheduler.acquire_locks, auto_start=True))
        if process is not None and not self.scheduler._process.is_alive():
            # Another worker took the lock and runs the scheduler: forget the dead one, or every
            # turn of the loop would run the maintenance again. RQ's own, every ten minutes,
            # still takes the lock over if that scheduler dies too.
            self.scheduler._process = None

    def _until_redis_answers(self, call):
        wait = 1
        while True:
            try:
                return call()
            except REDIS_UNREACHABLE as exc:  # RQ's loop quits on any of them
                if self._stop_requested:
                    raise
                self.log.warning("Worker %s: Redis does not answer (%s); asking again in %d s", self.name, exc, wait)
                time.sleep(wait)
                wait = min(wait * 2, REDIS_WAIT_MAX_SECONDS)
