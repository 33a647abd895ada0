"""Who used the CPU during a measurement: this benchmark's processes, or someone else's.

On a small shared machine a test suite running next to the benchmark changes its figures;
this makes that visible instead of silently skewing a ratio. Reads /proc only (Linux):
the machine's busy time from /proc/stat, and per process utime+stime, attributed to
- the benchmark's children by name (gunicorn, load generator, workers, sweeper),
- PostgreSQL backends by the database they serve (their process title names it): `surety_bench`
  as "postgres", and any other database the run names (the provider's),
- this process itself; everything else is "others".
"""

import os
import threading
import time

HZ = os.sysconf("SC_CLK_TCK")


def _busy_jiffies():
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle


def process_ticks(pid):
    """utime + stime of one process, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        raw = f.read()
    rest = raw[raw.rindex(")") + 2:].split()
    return int(rest[11]) + int(rest[12])


def _processes():
    """pid -> (ppid, ticks, comm)"""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        rest = raw[raw.rindex(")") + 2:].split()
        out[int(name)] = (int(rest[1]), int(rest[11]) + int(rest[12]), comm)
    return out


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class CpuMonitor:
    """Samples every `interval` seconds between start() and stop(); stop() returns CPUs used
    (1.0 = one core busy for the whole window) per category."""

    def __init__(self, named_pids, database="surety_bench", interval=0.25, databases=None):
        self.named_pids = named_pids  # callable: {pid: name} of the benchmark's direct children
        self.databases = {database: "postgres", **(databases or {})}  # database -> category
        self.interval = interval
        self.me = os.getpid()

    def start(self):
        self._stop = threading.Event()
        self._first, self._last, self._category = {}, {}, {}
        self._t0, self._busy0 = time.monotonic(), _busy_jiffies()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self):
        procs = _processes()
        named = self.named_pids()
        for pid, (ppid, ticks, comm) in procs.items():
            category = self._category.get(pid)
            if category in (None, "bench"):  # a child may be seen before it is named
                category = self._classify(pid, procs, named, comm)
                if category is None:
                    continue
                self._category[pid] = category
            self._first.setdefault(pid, ticks)
            self._last[pid] = ticks

    def _classify(self, pid, procs, named, comm):
        if pid == self.me:
            return "bench"
        if comm == "postgres":
            title = _cmdline(pid)
            return next((category for name, category in self.databases.items() if f" {name} " in title), None)
        seen, current = 0, pid
        while current in procs and seen < 50:  # climb to a direct child of this process
            parent = procs[current][0]
            if parent == self.me:
                return named.get(current, "bench")
            current, seen = parent, seen + 1
        return None

    def stop(self):
        self._stop.set()
        self._thread.join()
        self._sample()
        seconds = time.monotonic() - self._t0
        busy = (_busy_jiffies() - self._busy0) / HZ / seconds
        used = {}
        for pid, category in self._category.items():
            if pid in self._first:
                used[category] = used.get(category, 0.0) + (self._last[pid] - self._first[pid]) / HZ / seconds
        ours = sum(used.values())
        report = {name: round(v, 4) for name, v in sorted(used.items())}
        report.update({"all_busy": round(busy, 4), "others": round(max(0.0, busy - ours), 4),
                       "cpus": os.cpu_count(), "seconds": round(seconds, 2)})
        return report
