"""cdcstore.fs.S3Gateway: the settings each engine's own S3 reader takes for the gateway
(docs/engines.md), used as written against a real `cdcstore serve --s3-port` with tokens, so every
request is signed with the token and checked: polars' native reader, s3fs (pandas), pyarrow's
S3FileSystem (pandas `filesystem=`), each reading exact rows."""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.fs import S3Gateway
from cdcstore.storage.repository import LocalStore
from cdcstore.testing import ServedStore

TOKEN = "engines-token-" + "e" * 20


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("s3opts")
    data = root / "data" / "train"
    data.mkdir(parents=True)
    for i in range(2):
        pq.write_table(pa.table({"id": list(range(i * 500, i * 500 + 500)), "s": [f"r{j}" for j in range(500)]}),
                       data / f"part-{i}.parquet")
    LocalStore.init(str(root / "srv"))
    with Store(str(root / "srv")) as s:
        s.push([str(data)], "cdc://ds/train/", message="data")
    with ServedStore(root, tokens={TOKEN: {"scope": "read", "repos": ["*"], "name": "trainer"}}, gateway=True) as srv:
        yield srv


def test_each_engine_reads_with_the_settings_as_given(served):
    import pandas as pd
    import polars as pl
    gw = S3Gateway(served.s3, "trainer", TOKEN)
    assert pl.scan_parquet("s3://ds/main/train/*.parquet", storage_options=gw.polars()).collect()["id"].sum() \
        == sum(range(1000))
    assert sorted(pd.read_parquet("s3://ds/main/train/", storage_options=gw.s3fs())["id"]) == list(range(1000))
    assert sorted(pd.read_parquet("ds/main/train", filesystem=gw.pyarrow())["id"]) == list(range(1000))


def test_a_wrong_token_is_refused_and_bad_settings_are_named(served):
    import polars as pl
    with pytest.raises(Exception, match="(?i)SignatureDoesNotMatch|403|forbidden"):
        pl.scan_parquet("s3://ds/main/train/*.parquet",
                        storage_options=S3Gateway(served.s3, "trainer", "not-the-token").polars()).collect()
    with pytest.raises(ValueError, match="--s3-port"):
        S3Gateway("127.0.0.1:8471")
    with pytest.raises(ValueError, match="both"):
        S3Gateway("http://127.0.0.1:8471", "trainer")
    gw = S3Gateway("https://gw.example:443/", "a", "it's")
    assert gw.polars()["aws_allow_http"] == "false" and gw.hostport == "gw.example:443"
    assert "SECRET 'it''s'" in gw.duckdb_secret() and "USE_SSL true" in gw.duckdb_secret()
