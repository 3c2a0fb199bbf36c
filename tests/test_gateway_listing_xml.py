"""Issue 43 case 8: a key holding characters XML 1.0 cannot carry (a name committed before the
control-character rule) made listings that were not well-formed XML unless encoding-type=url was
asked. Without it the gateway now answers 400 naming encoding-type=url; with it (the AWS SDKs'
default) the key is listed percent-encoded. A real gateway over a directory store."""
import urllib.request
import xml.etree.ElementTree as ET

import pytest

from cdcstore import Store
from cdcstore.storage.repository import open_repository
from cdcstore.testing import ServedStore


@pytest.fixture
def gw(tmp_path):
    src = tmp_path / "f.txt"
    src.write_text("hi")
    with Store.init(str(tmp_path / "s")) as s:
        s.push([str(src)], "cdc://ds/")
    repo = open_repository(str(tmp_path / "s"))  # as a cdcstore before issue 31 wrote it
    head = repo.branches("ds")["main"]
    base = repo.get_commit("ds", head)
    entry = repo.view("ds", base).get("f.txt")
    repo.commit(repo.make_commit("ds", head, "old name", 0.0, {"bad\x01name.txt": entry}, (), base=base,
                                 author="old"), "main", head)
    with ServedStore(tmp_path, name="s", gateway=True) as srv:  # that store, as it is
        yield srv.s3


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_a_key_xml_cannot_carry_is_listed_only_url_encoded(gw):
    status, body = _get(gw + "/ds?list-type=2&prefix=main/")
    assert status == 400 and b"encoding-type=url" in body
    ET.fromstring(body)  # the error itself is well-formed
    status, body = _get(gw + "/ds?list-type=2&prefix=main/&encoding-type=url")
    assert status == 200
    keys = [k.text for k in ET.fromstring(body).iter("{http://s3.amazonaws.com/doc/2006-03-01/}Key")]
    assert keys == ["main/bad%01name.txt", "main/f.txt"]
    status, _ = _get(gw + "/ds?list-type=2&prefix=main/f")  # a listing without such a key is plain XML
    assert status == 200
