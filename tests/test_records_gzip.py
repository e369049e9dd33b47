"""Gzip records files (``.jsonl.gz``): what the plain reader promises — same records, a cut-off last write
skipped and repaired, bad bytes refused in one line — on members appended one record at a time or on one
member of a whole file; the checksum zlib verifies is what tells a cut-off member from a complete one. And gzip
JSON files (``.json.gz``, the study's Table-5 profiles): written atomically, read back equal, damage refused."""
import gzip
import json
import random

import pytest

import diffquant.records as records_module
from diffquant.errors import UserError
from diffquant.io import atomic_write_text, compact_json_object, locked_append, read_json_file
from diffquant.records import append_record, read_records, repair_tail


def _records(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"checkpoint": f"ckpt-{rng.randrange(10**6)}", "bits": rng.choice([4, 6, 8, 16]), "task": "copa",
             "kind": "multiple_choice",
             "metrics": {"acc": rng.random(), "acc_norm": rng.random(),
                         "items": [{"id": i, "ll": [rng.gauss(-30, 10), rng.gauss(-30, 10)]}
                                   for i in range(rng.randrange(1, 200))]}} for _ in range(n)]


def _append(path, records):
    with locked_append(path) as fh:
        for rec in records:
            append_record(fh, rec)


@pytest.fixture
def written(tmp_path):
    seed = random.randrange(10**6)
    print(f"records drawn with seed {seed}")  # shown with a failure: rerun with it
    records = _records(7, seed)
    path = tmp_path / "r.jsonl.gz"
    _append(path, records[:4])
    _append(path, records[4:])  # a second writer appends members to the same file
    return path, records


def test_appended_members_read_as_the_plain_file_does(written, tmp_path):
    path, records = written
    plain = tmp_path / "r.jsonl"
    _append(plain, records)
    assert read_records(path) == read_records(plain) == records
    assert gzip.decompress(path.read_bytes()) == plain.read_bytes()  # one valid gzip file: `zcat` reads it


def test_one_member_of_a_whole_file_reads_the_same(written, tmp_path):
    path, records = written
    whole = tmp_path / "whole.jsonl.gz"
    whole.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()), mtime=0))
    assert read_records(whole) == records


def test_every_cut_inside_the_last_member_loses_that_record_only(written, caplog):
    path, records = written
    data = path.read_bytes()
    last = len(gzip.compress((json.dumps(records[-1]) + "\n").encode(), mtime=0))
    start = len(data) - last
    cuts = {start + 1, start + 10, len(data) - 8, len(data) - 1} | set(random.sample(range(start + 1, len(data)), 6))
    for cut in sorted(cuts):
        path.write_bytes(data[:cut])
        assert read_records(path) == records[:-1], cut
        repair_tail(path)
        assert path.stat().st_size == start  # the cut-off member is gone, every whole one kept
        _append(path, records[-1:])
        assert read_records(path) == records and path.read_bytes() == data
    assert "truncated last record" in caplog.text


def test_a_member_ending_inside_a_line_is_read_but_not_cut(tmp_path):
    """A gzip'ed text cut short before compressing: its partial line is skipped like a plain file's, but resuming
    on it is refused (cutting inside a member would rewrite the records around it), the file left as it was."""
    path, records = tmp_path / "r.jsonl.gz", _records(2, seed=1)
    path.write_bytes(gzip.compress((json.dumps(records[0]) + "\n" + json.dumps(records[1])[:50]).encode()))
    before = path.read_bytes()
    assert read_records(path) == records[:1]
    with pytest.raises(ValueError, match="ends inside a line; decompress it"):
        repair_tail(path)
    assert path.read_bytes() == before


def test_a_whole_file_member_cut_short_is_refused_not_emptied(written, tmp_path):
    """`gzip -n` of a finished sweep, then cut (a copy interrupted): its records are in one member, so skipping
    the cut member would drop them all; reading and resuming refuse in one line and leave the file as it is."""
    path, records = written
    whole = tmp_path / "whole.jsonl.gz"
    whole.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()), mtime=0)[:-4])
    before = whole.read_bytes()
    for call in (read_records, repair_tail):
        with pytest.raises(ValueError, match="cut off and holds several records; recover them with `zcat`"):
            call(whole)
    assert whole.read_bytes() == before


def test_lines_running_across_members_and_padding_read_as_the_plain_file(written, tmp_path, monkeypatch):
    """Members split anywhere in the text (bgzip does so; a bare CR is JSON whitespace, not a line end), zero bytes
    between and after members (gzip's padding), an upper-case suffix, reads of a few bytes: the plain records."""
    path, records = written
    text = gzip.decompress(path.read_bytes()).replace(b", ", b",\r ")
    cuts = sorted(random.sample(range(1, len(text)), 20))
    members = [gzip.compress(text[a:b], mtime=0) for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    odd = tmp_path / "odd.JSONL.GZ"
    odd.write_bytes(b"\0\0".join(members) + b"\0" * 5)
    monkeypatch.setattr(records_module, "GZIP_READ_BYTES", 7)
    assert read_records(odd) == records
    size = odd.stat().st_size
    repair_tail(odd)  # nothing is cut
    assert odd.stat().st_size == size


def test_a_whole_last_record_without_its_newline_gets_one(tmp_path):
    path, records = tmp_path / "r.jsonl.gz", _records(3, seed=2)
    text = "".join(json.dumps(r) + "\n" for r in records[:2]).encode()
    path.write_bytes(gzip.compress(text.rstrip(b"\n"), mtime=0))
    assert read_records(path) == records[:2]
    repair_tail(path)
    _append(path, records[2:])
    assert read_records(path) == records


def test_members_are_written_deterministically_under_the_lock(written):
    """mtime 0 in every member's header (equal records give equal bytes); a second writer is refused."""
    path, _ = written
    assert path.read_bytes()[4:8] == bytes(4)
    with locked_append(path), pytest.raises(UserError, match="another process is writing"):
        locked_append(path).__enter__()


@pytest.mark.parametrize("where", ["deflate data", "checksum"])
def test_damaged_bytes_are_a_one_line_error(written, where):
    """Bytes zlib checks (not the header's unchecked time or OS fields) and bytes that are no gzip at all."""
    path, _ = written
    data = bytearray(path.read_bytes())
    data[20 if where == "deflate data" else -6] ^= 0xFF  # inside the first member's data; the last one's CRC
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="not a gzip-compressed records file") as info:
        read_records(path)
    assert "\n" not in str(info.value)
    path.write_bytes(b'{"bits": 4}\n' + bytes(data))
    with pytest.raises(ValueError, match="not a gzip-compressed records file"):
        read_records(path)


def test_a_json_gz_file_is_written_compressed_and_read_back_equal(tmp_path):
    data = {"transformer": _records(3, seed=7), "diff": {"lambda": [random.Random(8).random() for _ in range(8)]}}
    text = compact_json_object(data)
    path = atomic_write_text(tmp_path / "p.json.gz", text)
    assert gzip.decompress(path.read_bytes()).decode() == text
    assert read_json_file(path) == data == read_json_file(atomic_write_text(tmp_path / "p.json", text))
    first = path.read_bytes()
    atomic_write_text(path, text)  # mtime 0: equal text, equal bytes (a rerun leaves git nothing to commit)
    assert path.read_bytes() == first and path.stat().st_size < len(text) / 2


@pytest.mark.parametrize("damage", ["cut", "flipped", "not gzip"])
def test_a_damaged_json_gz_file_is_refused_in_one_line(tmp_path, damage):
    path = atomic_write_text(tmp_path / "p.json.gz", compact_json_object({"diff": _records(2, seed=9)}))
    raw = path.read_bytes()
    path.write_bytes({"cut": raw[: len(raw) // 2], "flipped": raw[:-8] + bytes([raw[-8] ^ 1]) + raw[-7:],
                      "not gzip": b'{"diff": 1}'}[damage])  # the flipped byte is in the CRC zlib checks
    with pytest.raises(ValueError, match="p.json.gz is not a whole gzip file") as err:
        read_json_file(path)
    assert "\n" not in str(err.value)
