"""Issue 32: a one-file edit pushed as a folder reads from the bucket only the trees on the changed
path. The trees a writer stores (a push, or upload + commit_entries) are kept in this machine's
cache, as trees it reads are, so its next push in a new process walks them from disk; before, a
cold process read every tree of the folder from the bucket (202 tree GETs for one file at 20,000
files). moto behind a counting proxy; the second push runs in a new process."""
import os
import secrets
import subprocess
import sys

import pytest

from cdcstore import Store
from conftest import S3_BUCKET

FOLDERS, PER = 12, 5


@pytest.fixture
def counted(counted_bucket, tmp_path):
    _, seen = counted_bucket
    src = tmp_path / "src"
    for d in range(FOLDERS):
        for f in range(PER):
            (src / f"d{d:02d}").mkdir(parents=True, exist_ok=True)
            (src / f"d{d:02d}" / f"f{f}.txt").write_text(f"folder {d} file {f}\n" * 20)
    return f"s3://{S3_BUCKET}/trees-{secrets.token_hex(4)}", src, seen


def _push_in_new_process(url: str, src, dest: str) -> None:
    code = ("import sys; from cdcstore import Store\n"
            "with Store(sys.argv[1]) as s: s.push([sys.argv[2]], sys.argv[3], message='edit')")
    subprocess.run([sys.executable, "-c", code, url, str(src), dest], check=True, env=dict(os.environ))


def _tree_gets(seen) -> int:
    return sum(1 for m, p in seen if m == "GET" and "/trees/" in p)


def test_an_edit_push_in_a_new_process_reads_only_the_changed_path(counted):
    url, src, seen = counted
    with Store.init(url) as s:
        s.push([str(src)], "cdc://ds/", message="v1")
    (src / "d03" / "f1.txt").write_text("edited\n")
    seen.clear()
    _push_in_new_process(url, src, "cdc://ds/")
    assert _tree_gets(seen) <= 2  # the old root and d03: the commit's check of what it adds (was 13: all)
    with Store(url) as s:
        assert s.cat("cdc://ds/d03/f1.txt") == b"edited\n"
        assert len(s.ls("cdc://ds/", recursive=True)) == FOLDERS * PER  # files only


def test_commits_made_by_upload_and_commit_entries_are_kept_too(counted):
    url, src, seen = counted
    with Store.init(url) as s:
        s.push([str(src)], "cdc://ds/", message="v1")
        up = s.upload([str(src / "d00" / "f0.txt")], "cdc://ds/extra/")
        s.commit_entries("cdc://ds/", up, message="extra")
    (src / "d07" / "f2.txt").write_text("edited too\n")
    seen.clear()
    _push_in_new_process(url, src, "cdc://ds/")
    assert _tree_gets(seen) <= 2  # the old root and d03: the commit's check of what it adds (was 13: all)


def test_a_commit_of_uploaded_files_reads_each_manifest_once(counted):
    """A commit of 20 files uploaded by another process (the dask/Ray path): the entry check
    reads each manifest once, and the commit's reach of what it adds reuses what it decoded
    (was two GETs a manifest)."""
    url, src, seen = counted
    with Store.init(url) as s:
        s.push([str(src / "d00")], "cdc://ds/", message="v1")
    new = src / "new"
    new.mkdir()
    for i in range(20):
        (new / f"n{i:02d}.bin").write_bytes(os.urandom(300))
    code = ("import sys, pickle; from cdcstore import Store\n"
            "with Store(sys.argv[1]) as s: sys.stdout.buffer.write(pickle.dumps(s.upload([sys.argv[2]], 'cdc://ds/new/')))")
    import pickle
    up = pickle.loads(subprocess.run([sys.executable, "-c", code, url, str(new)], check=True,
                                     capture_output=True, env=dict(os.environ)).stdout)
    seen.clear()
    with Store(url) as s:
        s.commit_entries("cdc://ds/", up, message="20 uploaded files")
        print(sorted(p for m, p in seen if m == "GET"))
        assert sum(1 for m, p in seen if m == "GET" and "/manifests/" in p) == 0  # all in one bundle (was 20)
        assert sum(1 for m, p in seen if m == "GET" and "/bundles/" in p) == 1  # read once
        assert s.cat("cdc://ds/new/n07.bin") == (new / "n07.bin").read_bytes()
