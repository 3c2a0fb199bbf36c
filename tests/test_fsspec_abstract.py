"""fsspec's own abstract test suite (`fsspec.tests.abstract`: copy, get, put, open, pipe) run
against `cdc://` on a directory store, with paths in both forms fsspec hands a filesystem:
`repo@branch/path` and `cdc://repo@branch/path`."""
import os
import posixpath
import shutil
import tempfile

import pytest

import fsspec.tests.abstract as abstract
from cdcstore.fs import CdcFileSystem
from cdcstore.storage.repository import LocalStore


@pytest.fixture(scope="module")
def cdc_fs(tmp_path_factory):
    # On tmpfs where there is one: ~500 small commits, each fsynced, take minutes on a busy disk
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    top = tempfile.mkdtemp(prefix="cdcstore-abstract-", dir=shm) if shm else str(tmp_path_factory.mktemp("abstract"))
    LocalStore.init(os.path.join(top, "store"))
    fs = CdcFileSystem(store=os.path.join(top, "store"), cache=False)
    try:
        yield fs
    finally:
        fs.store.close()
        shutil.rmtree(top, ignore_errors=True)


class CdcFixtures(abstract.AbstractFixtures):
    form = ""  # what paths start with: "" (repo@branch/path) or "cdc://"

    @pytest.fixture
    def fs(self, cdc_fs):
        return cdc_fs

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, request):
        return f"{self.form}abstract@main/{request.node.name.split('[')[0]}"

    @pytest.fixture
    def supports_empty_directories(self):
        return False  # a folder exists while a file is under it

    # The suite's source trees are made file by file (`touch`, `pipe`): on cdc:// each file would
    # be a commit, so they are made in one transaction (one commit); the trees are the same.
    def _one_commit(self, build, some_fs, some_join, some_path):
        if not isinstance(some_fs, CdcFileSystem):
            return build(some_fs, some_join, some_path)
        with some_fs.transaction:
            return build(some_fs, some_join, some_path)

    def _glob_edge_cases_files(self, *args):
        return self._one_commit(super()._glob_edge_cases_files, *args)

    def _bulk_operations_scenario_0(self, *args):
        return self._one_commit(super()._bulk_operations_scenario_0, *args)

    def _dir_and_file_with_same_name_prefix(self, *args):
        return self._one_commit(super()._dir_and_file_with_same_name_prefix, *args)

    def _10_files_with_hashed_names(self, *args):
        return self._one_commit(super()._10_files_with_hashed_names, *args)


class TestCdcCopy(abstract.AbstractCopyTests, CdcFixtures):
    pass


class TestCdcGet(abstract.AbstractGetTests, CdcFixtures):
    pass


class TestCdcPut(abstract.AbstractPutTests, CdcFixtures):
    pass


class TestCdcOpen(abstract.AbstractOpenTests, CdcFixtures):
    pass


class TestCdcPipe(abstract.AbstractPipeTests, CdcFixtures):
    pass


# The same suites with `cdc://` paths: listings come back in that form, so the suite's checks
# (`fs.find(target) == [fs_join(target, ...)]`) hold in it too. The 32 glob-pattern cases of each
# are run above in the plain form only (the patterns do not depend on the form; the url form's
# globbing is run by the `*_glob_to_*` tests here) to keep this file's time small.
class TestCdcCopyUrl(TestCdcCopy):
    form = "cdc://"
    test_copy_glob_edge_cases = None


class TestCdcGetUrl(TestCdcGet):
    form = "cdc://"
    test_get_glob_edge_cases = None


class TestCdcPutUrl(TestCdcPut):
    form = "cdc://"
    test_put_glob_edge_cases = None


class TestCdcOpenUrl(TestCdcOpen):
    form = "cdc://"


class TestCdcPipeUrl(TestCdcPipe):
    form = "cdc://"
