"""Many machines, random SIGKILLs, one bucket: no acknowledged push loses data.

N machines are child processes, each with its own XDG_CACHE_HOME (its own chunk index of the
bucket), on one moto bucket. A seeded schedule runs in rounds: each machine does one thing per
round (push new files and edited versions of earlier files, any machine's, so that pushes
deduplicate against other machines' data and against garbage; delete a branch or a repo;
`forget`; gc with no grace, some with repacking), all machines at once; the parent SIGKILLs
random machines at random moments of their operation and starts them again (the same cache
dir: a machine that rebooted). A machine writes each commit its push acknowledged to its
journal (fsync) only after the push returned. At the end a FRESH machine reads back every
acknowledged commit that the schedule did not delete or forget since, byte for byte, and
`check --read-data` is clean.

The seed is printed; CDCSTORE_FAULTS_SEED=N replays one, CDCSTORE_LONG_FAULTS=1 runs more
rounds over several seeds.
"""
import hashlib
import json
import logging
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import threading
import time

import pytest

from cdcstore import Store
from conftest import S3_BUCKET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LONG = os.environ.get("CDCSTORE_LONG_FAULTS") == "1"
REPOS = ("r0", "r1", "r2", "r3")
BRANCHES = ("main", "b1", "b2")
OP_TIMEOUT = 180.0  # seconds any one operation may take before the test fails (a wedged machine)

WORKER = r"""
import hashlib, json, os, sys, time
sys.path.insert(0, sys.argv[6])  # this tree's cdcstore, whatever the cwd or an editable install says
from cdcstore import Store
from cdcstore.core.errors import MissingChunksError

url, journal, token, admin_url, admin_token = sys.argv[1:6]
if token:
    # retries that outlast a replica's restart (about 7 s in all)
    s = Store(url, token=token, cache=False, backoff=0.2, max_backoff=2.0)
    admin = Store(admin_url, token=admin_token, cache=False, backoff=0.2, max_backoff=2.0)
else:
    s = admin = Store(url)


def say(doc):
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def push(cmd):
    pairs = [(local, path) for path, local in cmd["files"].items()]
    digests = {}
    for local, path in pairs:
        with open(local, "rb") as f:
            digests[path] = hashlib.sha256(f.read()).hexdigest()
    for attempt in range(4):  # a gc elsewhere deleted a pack this machine's index named: push again
        try:
            r = s.commit_files(cmd["repo"], cmd["branch"], pairs, message=f"round {cmd['round']}")
            break
        except MissingChunksError:
            if attempt == 3:
                raise
    rec = {"round": cmd["round"], "repo": cmd["repo"], "branch": cmd["branch"], "commit": r.commit,
           "files": digests, "retries": attempt, "new_bytes": r.new_bytes}
    with open(journal, "a") as f:  # acknowledged: the push returned
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return {"commit": r.commit, "retries": attempt, "new_bytes": r.new_bytes}


def run(cmd):
    op = cmd["op"]
    if op == "push":
        return push(cmd)
    if op == "delete_branch":
        return admin.delete_branch(cmd["repo"], cmd["branch"])
    if op == "delete_repo":
        return admin.delete_repo(cmd["repo"])
    if op == "forget":
        return admin.forget(cmd["repo"], keep_last=cmd["keep_last"])
    if op == "gc":
        return admin.gc(grace=0, **cmd["options"])
    raise ValueError(op)


say({"ready": os.getpid()})
for line in sys.stdin:
    cmd = json.loads(line)
    say({"start": cmd["op"]})
    t0 = time.monotonic()
    try:
        reply = {"ok": run(cmd)}
    except Exception as e:  # reported to the parent, which decides what is allowed
        reply = {"error": type(e).__name__, "msg": str(e)[:400]}
    reply["seconds"] = time.monotonic() - t0
    say(reply)
"""


def _markers(url: str) -> list[str]:
    """The gc and push-session markers in the bucket (what a wedged push waits on)."""
    import boto3

    bucket, prefix = url[len("s3://"):].split("/", 1)
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    out = []
    for folder in ("gc/", "sessions/"):
        for o in s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{folder}").get("Contents", []):
            out.append(f"{o['Key'][len(prefix) + 1:]} ({o['LastModified']:%H:%M:%S})")
    return out


class Machine:
    """One simulated machine: a child process with its own cache dir and journal, driven over
    stdin/stdout (one JSON command a line, one reply a line)."""

    def __init__(self, k: int, work, url: str, token: str = "", admin_url: str = "", admin_token: str = ""):
        self.k, self.url = k, url
        self.cache = str(work / f"machine-{k}")
        self.journal = str(work / f"journal-{k}.jsonl")
        self.errlog = str(work / f"machine-{k}.stderr")
        self.args = [url, self.journal, token, admin_url, admin_token, ROOT]
        self.proc = None
        self.lines: queue.Queue = queue.Queue()

    def start(self) -> "Machine":
        env = {**os.environ, "PYTHONPATH": ROOT, "XDG_CACHE_HOME": self.cache}
        self.lines = queue.Queue()
        with open(self.errlog, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-c", WORKER, *self.args], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True, env=env, bufsize=1)
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()
        return self

    @staticmethod
    def _read(proc, lines):
        for line in proc.stdout:
            lines.put(json.loads(line))
        lines.put(None)  # the process ended

    def next(self, timeout: float = OP_TIMEOUT) -> dict | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"machine {self.k} said nothing for {timeout:.0f} s; markers in the store: "
                                 f"{_markers(self.url)}; stderr:\n{self.stderr()}")

    def wait_ready(self) -> None:
        msg = self.next()
        assert msg and "ready" in msg, f"machine {self.k} did not start: {msg}\n{self.stderr()}"

    def send(self, cmd: dict) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def reply(self) -> dict:
        """The reply to the command sent (after its "start" line)."""
        while True:
            msg = self.next()
            assert msg is not None, f"machine {self.k} died; stderr:\n{self.stderr()}"
            if "start" not in msg:
                return msg

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def stderr(self) -> str:
        with open(self.errlog, errors="replace") as f:
            return f.read()[-3000:]

    def acked(self) -> list[dict]:
        if not os.path.exists(self.journal):
            return []
        with open(self.journal) as f:
            return [json.loads(line) for line in f if line.strip()]


class Data:
    """The files pushed: new random ones, edited versions of any earlier one (dedup against
    other machines' data, and against data that deletions made garbage), exact copies."""

    def __init__(self, rng: random.Random, folder):
        self.rng, self.folder, self.pool, self.n = rng, folder, [], 0
        folder.mkdir()

    def make(self) -> str:
        rng = self.rng
        roll = rng.random()
        if not self.pool or roll < 0.35:
            data = rng.randbytes(rng.randint(40_000, 400_000))
        elif roll < 0.9:
            data = bytearray(rng.choice(self.pool))
            for _ in range(rng.randint(1, 3)):  # replace, insert or cut a region
                at, span = rng.randrange(len(data)), rng.randint(1_000, 30_000)
                kind = rng.randrange(3)
                if kind == 0:
                    data[at:at + span] = rng.randbytes(min(span, len(data) - at))
                elif kind == 1:
                    data[at:at] = rng.randbytes(span)
                elif len(data) > 2 * span:
                    del data[at:at + span]
            data = bytes(data)
        else:
            data = rng.choice(self.pool)
        self.pool.append(data)
        self.n += 1
        path = self.folder / f"{self.n}.bin"
        path.write_bytes(data)
        return str(path)


GC_OPTIONS = ({}, {"repack_dead": 0.1}, {"max_unused": 0.0}, {"repack_dead": 0.05, "max_unused": 0.0})


def schedule_op(rng: random.Random, data: Data, k: int, rnd: int) -> dict:
    """One machine's operation in one round. Repo r0 is never deleted or forgotten (its
    commits are what must survive the others' deletions and gcs); r1..r3 are."""
    roll = rng.random()
    if roll < 0.58:
        repo = "r0" if rng.random() < 0.5 else rng.choice(REPOS)
        branch = rng.choice(BRANCHES) if rng.random() < 0.4 else "main"
        files = {f"m{k}/{rnd}/{i}.bin": data.make() for i in range(rng.randint(1, 3))}
        return {"op": "push", "round": rnd, "repo": repo, "branch": branch, "files": files}
    if roll < 0.68:
        return {"op": "delete_branch", "round": rnd, "repo": rng.choice(REPOS), "branch": rng.choice(BRANCHES[1:])}
    repo = rng.choice(REPOS[1:])
    if roll < 0.74:
        return {"op": "delete_repo", "round": rnd, "repo": repo}
    if roll < 0.80:
        return {"op": "forget", "round": rnd, "repo": repo, "keep_last": rng.randint(1, 2)}
    return {"op": "gc", "round": rnd, "options": rng.choice(GC_OPTIONS)}


# errors an operation may end with, whatever the faults (anything else fails the test)
ALLOWED = {
    "push": {"MissingChunksError"},  # after 4 tries: gc kept deleting what this machine's index named
    "delete_branch": {"RevisionNotFoundError", "RepoNotFoundError", "NotFoundError",
                      "InvalidAddressError"},  # "the only branch of repo": a repo's first push went to b1 or b2
    "delete_repo": {"RepoNotFoundError", "NotFoundError"},
    "forget": {"RepoNotFoundError", "NotFoundError"},
    "gc": set(),
}


def expected_commits(acked: list[dict], destroyed: list[tuple]) -> list[dict]:
    """The acknowledged commits the schedule left reachable: none of its deletions or forgets
    of that repo (or branch) was issued in the commit's round or later (rounds are barriers:
    every operation of a round has ended, or its machine was killed, before the next starts)."""
    out = []
    for rec in acked:
        hit = any(rnd >= rec["round"] and repo == rec["repo"] and (branch is None or branch == rec["branch"])
                  for rnd, repo, branch in destroyed)
        if not hit:
            out.append(rec)
    return out


def verify_from_fresh_machine(url: str, cache_dir, monkeypatch, expected: list[dict]) -> dict:
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_dir))
    with Store(url) as fresh:
        for rec in expected:
            for path, digest in rec["files"].items():
                got = fresh.cat(f"cdc://{rec['repo']}@{rec['commit']}/{path}")
                assert hashlib.sha256(got).hexdigest() == digest, (rec, path)
        report = fresh.check(read_data=True)
    assert report["problems"] == [], report["problems"]
    return report


def _median(xs: list[float], default: float) -> float:
    return sorted(xs)[len(xs) // 2] if xs else default


def run_schedule(seed: int, machines: list[Machine], rounds: int, data: Data, rng: random.Random,
                 replicas: list | None = None) -> dict:
    """Rounds of one operation per machine, at once; kills at random moments. Returns stats."""
    stats = {"rounds": rounds, "ops": 0, "kills_mid_op": 0, "kills_idle": 0, "replica_kills": 0, "errors": {},
             "gc_deleted": 0, "gc_runs": 0, "push_retries": 0, "pushes_acked": 0, "restart_s": 0.0}
    durations: dict[str, list[float]] = {}
    destroyed: list[tuple] = []
    unexpected = []
    lock = threading.Lock()
    for rnd in range(rounds):
        cmds = [schedule_op(rng, data, m.k, rnd) for m in machines]
        for cmd in cmds:
            if cmd["op"] == "delete_branch":
                destroyed.append((rnd, cmd["repo"], cmd["branch"]))
            elif cmd["op"] in ("delete_repo", "forget"):
                destroyed.append((rnd, cmd["repo"], None))
        victims = {m.k: rng.random() for m in machines if rng.random() < (0.4 if replicas is None else 0.25)}
        replica_victim = (rng.choice(replicas), rng.random()) if replicas and rng.random() < 0.6 else None
        replies: dict[int, dict] = {}

        def killer(m, cmd, share):
            """Kill `m` a random share of the way into its operation (scaled by how long that
            kind of operation has taken so far); if it answers first, the kill lands between
            operations."""
            msg = m.next()
            assert msg and "start" in msg, (m.k, msg, m.stderr())
            try:
                answered = m.lines.get(timeout=share * 0.9 * _median(durations.get(cmd["op"], []), 1.0))
            except queue.Empty:
                answered = None
            m.kill()
            while answered is None and (msg := m.next()) is not None:  # it answered just before the kill
                answered = msg
            with lock:
                stats["kills_idle" if answered else "kills_mid_op"] += 1
                if answered:
                    replies[m.k] = answered

        def replica_killer(server, share):
            """Kill a replica a random moment into the round; start it again."""
            time.sleep(share * 1.1 * _median([r for v in durations.values() for r in v], 1.0))  # the moment
            server.kill()
            server.log.close()
            server.start()
            with lock:
                stats["replica_kills"] += 1

        for m, cmd in zip(machines, cmds):
            m.send(cmd)
        threads = [threading.Thread(target=killer, args=(m, cmd, victims[m.k]))
                   for m, cmd in zip(machines, cmds) if m.k in victims]
        if replica_victim:
            threads.append(threading.Thread(target=replica_killer, args=replica_victim))
        for t in threads:
            t.start()
        for m in machines:
            if m.k not in victims:
                replies[m.k] = m.reply()
        for t in threads:
            t.join()
        t0 = time.monotonic()
        for m in machines:
            if m.k in victims:
                m.start()
        for m in machines:
            if m.k in victims:
                m.wait_ready()
        stats["restart_s"] += time.monotonic() - t0
        for m, cmd in zip(machines, cmds):
            stats["ops"] += 1
            r = replies.get(m.k)
            if r is None:
                continue  # killed before it answered
            durations.setdefault(cmd["op"], []).append(r["seconds"])
            if "error" in r:
                stats["errors"][r["error"]] = stats["errors"].get(r["error"], 0) + 1
                if r["error"] not in ("RepoNotFoundError", "RevisionNotFoundError"):
                    print(f"round {rnd} machine {m.k} {cmd['op']}: {r['error']}: {r['msg'][:160]}")
                allowed = ALLOWED[cmd["op"]] | ({"RemoteError"} if replicas else set())
                if r["error"] not in allowed:
                    unexpected.append((rnd, m.k, cmd, r))
            elif cmd["op"] == "gc":
                stats["gc_runs"] += 1
                stats["gc_deleted"] += bool(r["ok"]["deleted"])
                stats["gc_held_by_sessions"] = stats.get("gc_held_by_sessions", 0) + bool(r["ok"]["open_sessions"])
            elif cmd["op"] == "push":
                stats["pushes_acked"] += 1
                stats["push_retries"] += r["ok"]["retries"]
    assert unexpected == [], f"seed {seed}: operations failed in ways no fault explains: {unexpected}"
    stats["restart_s"] = round(stats["restart_s"], 1)
    stats["destroyed"] = destroyed
    return stats


def _bucket(s3_env, tmp_path, monkeypatch, name: str) -> str:
    url = f"s3://{S3_BUCKET}/{name}-{secrets.token_hex(4)}"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "init-cache"))
    Store.init(url).close()
    return url


def _seeds() -> list[int]:
    if os.environ.get("CDCSTORE_FAULTS_SEED"):
        return [int(os.environ["CDCSTORE_FAULTS_SEED"])]
    return [secrets.randbelow(10**6) for _ in range(4)] if LONG else [1717]


@pytest.mark.parametrize("seed", _seeds())
def test_machines_pushing_deleting_and_collecting_under_sigkill_lose_no_acknowledged_commit(
        seed, s3_env, tmp_path, monkeypatch):
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's request log
    print(f"\nseed {seed} (replay: CDCSTORE_FAULTS_SEED={seed})")
    t0 = time.monotonic()
    rng = random.Random(seed)
    url = _bucket(s3_env, tmp_path, monkeypatch, "faults")
    n = rng.choice((3, 4))
    machines = [Machine(k, tmp_path, url) for k in range(n)]
    for m in machines:
        m.start()
    for m in machines:
        m.wait_ready()
    try:
        stats = run_schedule(seed, machines, 30 if LONG else 7, Data(rng, tmp_path / "data"), rng)
        # the end: one more gc from a machine whose index is stale (it was killed or saw none of it)
        m = machines[0]
        m.send({"op": "gc", "round": -1, "options": {"max_unused": 0.0}})
        last_gc = m.reply()
        assert "ok" in last_gc and last_gc["ok"]["deleted"], last_gc
    finally:
        for m in machines:
            m.stop()
    acked = [rec for m in machines for rec in m.acked()]
    expected = expected_commits(acked, stats.pop("destroyed"))
    t1 = time.monotonic()
    report = verify_from_fresh_machine(url, tmp_path / "fresh-machine", monkeypatch, expected)
    print(f"{n} machines, {stats}, acknowledged {len(acked)} commits, {len(expected)} still reachable read back "
          f"({sum(len(r['files']) for r in expected)} files); check: {report.get('packs')} packs; "
          f"schedule {t1 - t0:.1f} s, verify {time.monotonic() - t1:.1f} s")
    assert stats["kills_mid_op"] >= (10 if LONG else 2)
    assert len(expected) >= 3


# -- through two replicas: pushes through B, admin (delete-repo, forget, gc) through A ----------------------

from test_many_machines import ADMIN, WRITE, bucket_url, replicas  # noqa: E402,F401  (fixtures)


@pytest.mark.parametrize("seed", _seeds())
def test_machines_through_two_replicas_under_sigkill_lose_no_acknowledged_commit(
        seed, replicas, bucket_url, s3_env, tmp_path, monkeypatch):
    """The same schedule with the machines as clients: pushes go through replica B, deletions,
    forget and gc (grace 0: `--min-gc-grace 0`) through replica A with an admin token; both
    replicas are SIGKILLed at random moments and started again (each keeps its index cache)."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    print(f"\nseed {seed} (replay: CDCSTORE_FAULTS_SEED={seed})")
    t0 = time.monotonic()
    rng = random.Random(seed)
    a, b = replicas
    n = rng.choice((3, 4))
    machines = [Machine(k, tmp_path, b.url, WRITE, a.url, ADMIN) for k in range(n)]
    for m in machines:
        m.start()
    for m in machines:
        m.wait_ready()
    try:
        stats = run_schedule(seed, machines, 24 if LONG else 6, Data(rng, tmp_path / "data"), rng, replicas=[a, b])
        # the end: one more gc through A, whose index the kills and B's pushes left stale
        machines[0].send({"op": "gc", "round": -1, "options": {"max_unused": 0.0}})
        last_gc = machines[0].reply()
        assert "ok" in last_gc, last_gc
        stats["last_gc"] = {k: last_gc["ok"][k] for k in ("deleted", "open_sessions", "delete_packs", "repack_packs")}
    finally:
        for m in machines:
            m.stop()
    acked = [rec for m in machines for rec in m.acked()]
    expected = expected_commits(acked, stats.pop("destroyed"))
    t1 = time.monotonic()
    report = verify_from_fresh_machine(bucket_url, tmp_path / "fresh-machine", monkeypatch, expected)
    print(f"{n} machines via 2 replicas, {stats}, acknowledged {len(acked)} commits, {len(expected)} still reachable "
          f"read back ({sum(len(r['files']) for r in expected)} files); check: {report.get('packs')} packs; "
          f"schedule {t1 - t0:.1f} s, verify {time.monotonic() - t1:.1f} s")
    assert stats["kills_mid_op"] + stats["replica_kills"] >= (10 if LONG else 3)
    assert len(expected) >= 3
