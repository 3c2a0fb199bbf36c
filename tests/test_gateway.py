"""The S3 read gateway (`cdcstore serve --s3-port`, remote/gateway/reads.py) with real S3 clients
against one real server on loopback: boto3, pyarrow's S3FileSystem, polars' native reader,
s3fs and the AWS CLI. Each read checks exact row counts and a content checksum against the
source files. The SigV4 math is pinned by AWS's published example figures."""
import hashlib
import os
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from cdcstore import Store
from cdcstore.core import sigv4
from cdcstore.storage.repository import LocalStore
from cdcstore.testing import ServedStore, free_port
from server_util import ServerProcess
from tool_venvs import aws_cli

import boto3  # noqa: E402 - in the test extra
from botocore import UNSIGNED  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

READER, OTHER = "reader-token-" + "r" * 20, "other-token-" + "o" * 20
TOKENS = {READER: {"scope": "read", "repos": ["*"], "name": "reader"},
          OTHER: {"scope": "read", "repos": ["elsewhere"], "name": "other"}}
MANY = [f"f{i:02d}.txt" for i in range(23)]  # with 3 folders: 26 entries under many/
ODD = "a b+c=d&é~(1)%41.txt"  # what each client must encode, and sign, its own way


def _table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"id": np.arange(seed * 1_000_000, seed * 1_000_000 + n),
                     "score": rng.random(n), "text": pa.array([f"row-{seed}-{i:07d}" for i in range(n)])})


def checksum(t: pa.Table) -> tuple:
    """Rows, the sum of ids, and a hash of every value of the table in id order."""
    t = t.sort_by("id")
    h = hashlib.sha256()
    for name in ("id", "score", "text"):
        h.update(repr(t.column(name).to_pylist()).encode())
    return t.num_rows, int(pc.sum(t.column("id")).as_py()), h.hexdigest()


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    root = tmp_path_factory.mktemp("gateway")
    data = root / "data"
    (data / "train").mkdir(parents=True)
    pq.write_table(_table(60_000, 1), data / "one.parquet", row_group_size=20_000)
    for i in range(3):
        pq.write_table(_table(15_000, 10 + i), data / "train" / f"part-{i}.parquet")
    (data / "many").mkdir()
    for name in MANY:
        (data / "many" / name).write_text(f"file {name}\n")
    for d in ("sub0", "sub1", "sub2"):
        (data / "many" / d).mkdir()
        (data / "many" / d / "x.txt").write_text(d)
    (data / "many" / "f05.txt-b").write_text("sorts between f05.txt and f06.txt")
    (data / "odd").mkdir()
    (data / "odd" / ODD).write_text("odd name")
    LocalStore.init(str(root / "srv"))
    with Store(str(root / "srv")) as s:
        s.push([str(p) for p in sorted(data.iterdir())], "cdc://imagenet/", message="data")
        s.tag("imagenet", "v1")
        s.push([str(data / "many" / "sub0")], "cdc://elsewhere/", message="other repo")
    with ServedStore(root, tokens=TOKENS, gateway=True) as srv:  # that store, as it is
        srv.data = data
        yield srv


def client(gw, key="reader", secret=READER, **kw):
    return boto3.client("s3", endpoint_url=gw.s3, aws_access_key_id=key, aws_secret_access_key=secret,
                        region_name="us-east-1", **kw)


def _code(e: pytest.ExceptionInfo) -> str:
    return e.value.response["Error"]["Code"]


def test_sigv4_matches_aws_published_examples():
    """The header example of AWS's S3 SigV4 documentation (GET /test.txt, Range bytes=0-9), its
    presigned-URL example, and get-vanilla-query-order-key-case of the SigV4 test suite."""
    h = {"host": "examplebucket.s3.amazonaws.com", "range": "bytes=0-9", "x-amz-content-sha256": sigv4.EMPTY_SHA256,
         "x-amz-date": "20130524T000000Z"}
    good = "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    header = ("AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,"
              "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,Signature=")
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    signed = sigv4.parse_header(header + good, "20130524T000000Z")
    assert sigv4.matches(secret, signed, "GET", "/test.txt", "", h, sigv4.EMPTY_SHA256)
    assert not sigv4.matches(secret + "x", signed, "GET", "/test.txt", "", h, sigv4.EMPTY_SHA256)
    assert not sigv4.matches(secret, signed, "GET", "/test.txt", "", {**h, "range": "bytes=0-10"}, sigv4.EMPTY_SHA256)
    q = ("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2F"
         "aws4_request&X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host&X-Amz-Signature="
         "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404")
    pre = sigv4.parse_query(dict(sigv4.split_query(q)))
    assert sigv4.matches(secret, pre, "GET", "/test.txt", q, {"host": "examplebucket.s3.amazonaws.com"}, None)
    assert sigv4.time_problem(pre, sigv4.epoch("20130525T000001Z")) == "Request has expired"
    vanilla = sigv4.parse_header(
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;"
        "x-amz-date, Signature=b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500", "20150830T123600Z")
    assert sigv4.matches("wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", vanilla, "GET", "/", "Param2=value2&Param1=value1",
                         {"host": "example.amazonaws.com", "x-amz-date": "20150830T123600Z"}, sigv4.EMPTY_SHA256)


def test_boto3_get_ranges_and_head(gw):
    s3 = client(gw)
    src = (gw.data / "one.parquet").read_bytes()
    whole = s3.get_object(Bucket="imagenet", Key="main/one.parquet")
    assert hashlib.sha256(whole["Body"].read()).digest() == hashlib.sha256(src).digest()
    part = s3.get_object(Bucket="imagenet", Key="main/one.parquet", Range="bytes=100-300099")
    assert part["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert part["ContentRange"] == f"bytes 100-300099/{len(src)}"
    assert part["Body"].read() == src[100:300100]  # across several chunks
    tail = s3.get_object(Bucket="imagenet", Key="main/one.parquet", Range="bytes=-8")["Body"].read()
    assert tail == src[-8:] and tail.endswith(b"PAR1")
    over = s3.get_object(Bucket="imagenet", Key="main/one.parquet", Range=f"bytes={len(src) - 5}-{len(src) + 99}")
    assert over["ContentRange"] == f"bytes {len(src) - 5}-{len(src) - 1}/{len(src)}"  # clamped to the end
    assert over["Body"].read() == src[-5:]
    head = s3.head_object(Bucket="imagenet", Key="main/one.parquet")
    assert head["ContentLength"] == len(src)
    with pytest.raises(ClientError) as e:  # the ETag is what a conditional read compares
        s3.get_object(Bucket="imagenet", Key="main/one.parquet", IfMatch='"' + "0" * 64 + '"')
    assert _code(e) == "PreconditionFailed"
    assert s3.get_object(Bucket="imagenet", Key="main/one.parquet", IfMatch=head["ETag"], Range="bytes=0-3")[
        "Body"].read() == b"PAR1"
    # the ETag is the content's: the same through a tag, another through another file
    assert s3.head_object(Bucket="imagenet", Key="v1/one.parquet")["ETag"] == head["ETag"] == whole["ETag"]
    assert s3.head_object(Bucket="imagenet", Key="main/train/part-0.parquet")["ETag"] != head["ETag"]
    commit = s3.list_objects_v2(Bucket="imagenet", Prefix="main/one")["Contents"][0]
    assert commit["ETag"] == head["ETag"] and commit["LastModified"] == head["LastModified"]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="imagenet", Key="main/one.parquet", Range=f"bytes={len(src)}-")
    assert _code(e) == "InvalidRange"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="imagenet", Key="main/nope.parquet")
    assert _code(e) == "NoSuchKey"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket="imagenet", Key="no-such-branch/one.parquet")
    assert _code(e) == "NoSuchKey"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket="imagenet", Key="main/train")  # a folder is no object
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as e:
        s3.list_objects_v2(Bucket="nosuchrepo")
    assert _code(e) == "NoSuchBucket"
    cid = s3.get_object(Bucket="imagenet", Key="main/one.parquet")  # a commit id is a revision too
    with Store(gw.store) as s:
        full = s.resolve_ref("imagenet", "main")[0]
    assert s3.get_object(Bucket="imagenet", Key=f"{full}/one.parquet")["ETag"] == cid["ETag"]


def _pages(s3, **kw):
    keys, prefixes, pages = [], [], 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket="imagenet", **kw):
        pages += 1
        assert page["KeyCount"] == len(page.get("Contents", [])) + len(page.get("CommonPrefixes", []))
        keys += [c["Key"] for c in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return keys, prefixes, pages


def test_boto3_list_v2_pages_with_delimiter(gw):
    s3 = client(gw)
    keys, prefixes, pages = _pages(s3, Prefix="main/many/", Delimiter="/", PaginationConfig={"PageSize": 7})
    files = sorted(MANY + ["f05.txt-b"])
    assert keys == [f"main/many/{n}" for n in files]  # in S3 key order: f05.txt < f05.txt-b < f06.txt
    assert prefixes == [f"main/many/sub{i}/" for i in range(3)]
    assert pages == 4  # 27 entries, 7 a page
    assert _pages(s3, Delimiter="/")[1] == ["main/", "v1/"]  # the bucket's top: its branches and tags
    everything, _, _ = _pages(s3, Prefix="main/", PaginationConfig={"PageSize": 5})
    local = sorted("main/" + str(p.relative_to(gw.data)) for p in gw.data.rglob("*") if p.is_file())
    assert everything == local  # recursive, sorted as S3 sorts
    first = s3.list_objects_v2(Bucket="imagenet", Prefix="main/many/f1", MaxKeys=3)
    assert first["IsTruncated"] and first["KeyCount"] == 3 and "NextContinuationToken" in first
    nxt = s3.list_objects_v2(Bucket="imagenet", Prefix="main/many/f1", ContinuationToken=first["NextContinuationToken"])
    assert [c["Key"] for c in first["Contents"] + nxt["Contents"]] == [f"main/many/f1{i}.txt" for i in range(10)]
    after = s3.list_objects_v2(Bucket="imagenet", Prefix="main/many/", StartAfter="main/many/f21.txt", Delimiter="/")
    assert [c["Key"] for c in after["Contents"]] == ["main/many/f22.txt"]
    assert not after["IsTruncated"]
    assert s3.list_objects_v2(Bucket="imagenet", Prefix="nosuch/")["KeyCount"] == 0
    v1 = s3.list_objects(Bucket="imagenet", Prefix="main/train/")
    assert [c["Key"] for c in v1["Contents"]] == [f"main/train/part-{i}.parquet" for i in range(3)]


def test_keys_that_need_encoding_sign_and_list(gw):
    from pyarrow import fs as pafs
    s3 = client(gw)
    key = f"main/odd/{ODD}"
    assert s3.get_object(Bucket="imagenet", Key=key)["Body"].read() == b"odd name"
    assert [c["Key"] for c in s3.list_objects_v2(Bucket="imagenet", Prefix="main/odd/")["Contents"]] == [key]
    pa_s3 = pafs.S3FileSystem(access_key="reader", secret_key=READER, endpoint_override=gw.s3.split("//")[1],
                              scheme="http", region="us-east-1")
    with pa_s3.open_input_stream(f"imagenet/{key}") as f:
        assert f.read() == b"odd name"
    assert [i.path for i in pa_s3.get_file_info(pafs.FileSelector("imagenet/main/odd"))] == [f"imagenet/{key}"]


def test_boto3_credentials_map_to_tokens(gw):
    with pytest.raises(ClientError) as e:
        client(gw, secret=READER + "x").get_object(Bucket="imagenet", Key="main/one.parquet")
    assert _code(e) == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as e:  # an unknown name answers as a wrong secret: names cannot be probed
        client(gw, key="nobody").list_objects_v2(Bucket="imagenet")
    assert _code(e) == "SignatureDoesNotMatch"
    wrong_secret = e.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as e:
        client(gw, secret=READER + "x").list_objects_v2(Bucket="imagenet")
    assert e.value.response["Error"]["Message"] == wrong_secret
    other = client(gw, key="other", secret=OTHER)
    with pytest.raises(ClientError) as e:
        other.get_object(Bucket="imagenet", Key="main/one.parquet")
    assert _code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        other.list_objects_v2(Bucket="imagenet")
    assert _code(e) == "AccessDenied"
    assert [b["Name"] for b in other.list_buckets()["Buckets"]] == ["elsewhere"]
    assert [b["Name"] for b in client(gw).list_buckets()["Buckets"]] == ["elsewhere", "imagenet"]
    assert other.get_object(Bucket="elsewhere", Key="main/x.txt")["Body"].read() == b"sub0"
    with pytest.raises(ClientError) as e:
        client(gw, config=Config(signature_version=UNSIGNED)).get_object(Bucket="imagenet", Key="main/one.parquet")
    assert _code(e) == "AccessDenied"
    params = {"Bucket": "imagenet", "Key": "main/many/f01.txt"}
    with pytest.raises(urllib.error.HTTPError) as e:  # botocore presigns with SigV2 unless told: named
        urllib.request.urlopen(client(gw).generate_presigned_url("get_object", Params=params, ExpiresIn=60))
    assert e.value.code == 400 and b"SigV2" in e.value.read()
    url = client(gw, config=Config(signature_version="s3v4")).generate_presigned_url("get_object", Params=params,
                                                                                      ExpiresIn=60)
    with urllib.request.urlopen(url) as r:
        assert r.read() == b"file f01.txt\n"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url.replace("f01.txt", "f02.txt"))
    assert e.value.code == 403 and b"<Code>SignatureDoesNotMatch</Code>" in e.value.read()


def test_boto3_writes_of_a_read_token_are_refused_clearly(gw):
    """Writes are served (tests/test_gateway_write.py); a read-scope token's are 403 AccessDenied."""
    s3 = client(gw)
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket="imagenet", Key="main/new.txt", Body=b"x")
    assert _code(e) == "AccessDenied" and "write scope" in e.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as e:
        s3.delete_object(Bucket="imagenet", Key="main/one.parquet")
    assert _code(e) == "AccessDenied"
    assert s3.head_object(Bucket="imagenet", Key="main/one.parquet")["ContentLength"] > 0


def test_pyarrow_s3filesystem_reads_a_file_and_a_dataset(gw):
    from pyarrow import fs as pafs
    import pyarrow.dataset as ds
    s3 = pafs.S3FileSystem(access_key="reader", secret_key=READER, endpoint_override=gw.s3.split("//")[1],
                           scheme="http", region="us-east-1")
    one = pq.read_table("imagenet/main/one.parquet", filesystem=s3)
    assert checksum(one) == checksum(pq.read_table(gw.data / "one.parquet"))
    cols = pq.read_table("imagenet/main/one.parquet", filesystem=s3, columns=["id"])
    assert cols.num_rows == 60_000 and cols.column_names == ["id"]
    train = ds.dataset("imagenet/main/train", filesystem=s3, format="parquet").to_table()
    assert checksum(train) == checksum(pq.read_table(gw.data / "train"))
    info = s3.get_file_info("imagenet/main/train")
    assert info.type == pafs.FileType.Directory


def test_polars_scan_parquet_natively(gw):
    import polars as pl
    opts = {"aws_access_key_id": "reader", "aws_secret_access_key": READER, "aws_endpoint_url": gw.s3,
            "aws_region": "us-east-1", "aws_allow_http": "true"}
    one = pl.scan_parquet("s3://imagenet/main/one.parquet", storage_options=opts).collect()
    assert checksum(one.to_arrow()) == checksum(pq.read_table(gw.data / "one.parquet"))
    train = pl.scan_parquet("s3://imagenet/main/train/*.parquet", storage_options=opts)
    assert train.select(pl.len()).collect().item() == 45_000
    assert checksum(train.collect().to_arrow()) == checksum(pq.read_table(gw.data / "train"))


def test_s3fs_lists_and_reads(gw):
    import s3fs
    fs = s3fs.S3FileSystem(key="reader", secret=READER, endpoint_url=gw.s3, client_kwargs={"region_name": "us-east-1"},
                           skip_instance_cache=True)
    assert sorted(fs.ls("imagenet/main/train")) == [f"imagenet/main/train/part-{i}.parquet" for i in range(3)]
    src = (gw.data / "train" / "part-1.parquet").read_bytes()
    with fs.open("imagenet/main/train/part-1.parquet", "rb", block_size=4096) as f:
        f.seek(5000)
        assert f.read(9000) == src[5000:14000]
    t = pq.read_table("imagenet/main/train/part-1.parquet", filesystem=fs)
    assert checksum(t) == checksum(pq.read_table(gw.data / "train" / "part-1.parquet"))


def test_aws_cli_syncs_a_folder(gw, tmp_path):
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "reader", "AWS_SECRET_ACCESS_KEY": READER,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    env.pop("AWS_ENDPOINT_URL", None)
    aws = aws_cli()
    run = lambda *a: subprocess.run([aws, "--endpoint-url", gw.s3, "s3", *a], env=env, capture_output=True,  # noqa
                                    text=True, timeout=60)
    sync = run("sync", "s3://imagenet/main/train/", str(tmp_path / "train"))  # a listing, then a GET per file
    assert sync.returncode == 0, sync.stderr
    assert sorted(os.listdir(tmp_path / "train")) == [f"part-{i}.parquet" for i in range(3)]
    for i in range(3):
        name = f"part-{i}.parquet"
        assert (tmp_path / "train" / name).read_bytes() == (gw.data / "train" / name).read_bytes()


def _signed_get(url: str, key: str, secret: str, amz_date: str) -> tuple[int, bytes]:
    """A GET signed by hand (core/sigv4.py) with a chosen X-Amz-Date."""
    from urllib.parse import urlsplit
    u = urlsplit(url)
    headers = {"host": u.netloc, "x-amz-content-sha256": sigv4.UNSIGNED, "x-amz-date": amz_date}
    signed = sigv4.Signed(key, amz_date[:8], "us-east-1", "s3", tuple(sorted(headers)), "", amz_date, False)
    request = sigv4.canonical_request("GET", sigv4.canonical_uri(u.path), "", headers, signed.signed_headers,
                                      sigv4.UNSIGNED)
    auth = (f"{sigv4.ALGORITHM} Credential={key}/{signed.scope}, SignedHeaders={';'.join(signed.signed_headers)}, "
            f"Signature={sigv4.sign(secret, signed, request)}")
    req = urllib.request.Request(url, headers={"Authorization": auth, "X-Amz-Date": amz_date,
                                               "X-Amz-Content-Sha256": sigv4.UNSIGNED})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_signature_from_another_time_is_refused(gw):
    import time
    url = f"{gw.s3}/imagenet/main/many/f03.txt"
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    assert _signed_get(url, "reader", READER, now) == (200, b"file f03.txt\n")
    status, body = _signed_get(url, "reader", READER, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - 3600)))
    assert status == 403 and b"<Code>RequestTimeTooSkewed</Code>" in body


def test_open_server_reads_anonymously_and_never_serves_a_damaged_byte(tmp_path):
    """No tokens: unsigned requests read, as on the native API. A chunk damaged on disk fails
    the request (500, naming `check`) instead of sending the wrong bytes."""
    data = tmp_path / "data"
    data.mkdir()
    payload = np.random.default_rng(3).bytes(300_000)  # incompressible: the chunks lie raw in the pack
    (data / "blob.bin").write_bytes(payload)
    LocalStore.init(str(tmp_path / "srv"))
    with Store(str(tmp_path / "srv")) as s:
        s.push([str(data / "blob.bin")], "cdc://open/", message="blob")
    port = free_port()
    with ServerProcess(str(tmp_path / "srv"), "--s3-port", str(port)).start():
        anon = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                            config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}))
        assert anon.get_object(Bucket="open", Key="main/blob.bin")["Body"].read() == payload
        assert client(type("S", (), {"s3": f"http://127.0.0.1:{port}"}), key="any", secret="thing") \
            .get_object(Bucket="open", Key="main/blob.bin", Range="bytes=5-9")["Body"].read() == payload[5:10]
        pack = next((tmp_path / "srv").rglob("*.pack"))
        raw = bytearray(pack.read_bytes())
        at = raw.find(payload[150_000:150_064])
        assert at > 0
        raw[at + 10] ^= 0xFF
        pack.write_bytes(bytes(raw))
        with pytest.raises(ClientError) as e:
            anon.get_object(Bucket="open", Key="main/blob.bin")["Body"].read()
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
        assert "cdcstore check" in e.value.response["Error"]["Message"]


def test_a_signature_that_is_not_hex_is_a_400_never_a_500(gw):
    """Issue 31, case 8: a non-ASCII `Signature=` made the comparison raise (500 and a server
    traceback). A signature that is not 64 lowercase hex digits is refused as malformed."""
    import http.client
    import time
    host, port = gw.s3[len("http://"):].split(":")
    now = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for signature in ("\u00e9" * 64, "ZZ", "A" * 64):
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        auth = (f"AWS4-HMAC-SHA256 Credential=reader/{now[:8]}/us-east-1/s3/aws4_request, "
                f"SignedHeaders=host;x-amz-date, Signature={signature}")
        conn.putrequest("GET", "/imagenet/main/many/f03.txt")
        conn.putheader("Authorization", auth.encode("latin-1"))
        conn.putheader("X-Amz-Date", now)
        conn.endheaders()
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        assert resp.status == 400 and b"AuthorizationHeaderMalformed" in body, (resp.status, body[:300])
