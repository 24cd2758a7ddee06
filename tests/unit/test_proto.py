"""The generated modules in epp/_proto are what ``proto/generate.py`` makes from proto/ now."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("proto_generate", REPO / "proto" / "generate.py")
assert SPEC is not None and SPEC.loader is not None
generate = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(generate)
VERSION = re.compile(r"^# Protobuf Python Version: .*$", re.M)
DESCRIPTOR = re.compile(rb"AddSerializedFile\((b'.*?')\)", re.S)


def test_generated_modules_are_not_stale(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert {p.name for p in written} == {
        "epp_admin_v1_pb2.py",
        "epp_admin_v1_pb2.pyi",
        "epp_extproc_v3_pb2.py",
        "epp_extproc_v3_pb2.pyi",
        "epp_vertexai_v1_pb2.py",
        "epp_vertexai_v1_pb2.pyi",
        "epp_vllmgrpc_v1_pb2.py",
        "epp_vllmgrpc_v1_pb2.pyi",
    }
    for fresh in written:
        committed = REPO / "epp" / "_proto" / fresh.name
        assert committed.exists(), f"{committed} missing: run `python proto/generate.py`"
        new, old = fresh.read_text(), committed.read_text()
        if VERSION.findall(new) == VERSION.findall(old):
            assert new == old, f"{committed} is stale: run `python proto/generate.py`"
        else:  # another protoc: the descriptor (what the .proto says) must still match
            assert DESCRIPTOR.findall(new.encode()) == DESCRIPTOR.findall(old.encode()), (
                f"{committed} is stale: run `python proto/generate.py`"
            )


def test_a_changed_proto_makes_the_check_fail(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The check has teeth: one more field gives a different module."""
    src = tmp_path / "proto"
    (src / "epp" / "admin" / "v1").mkdir(parents=True)
    text = (REPO / "proto" / "epp" / "admin" / "v1" / "admin.proto").read_text()
    changed = text.replace(
        "message DumpStateRequest {}", "message DumpStateRequest { int32 x = 1; }"
    )
    assert changed != text
    (src / "epp" / "admin" / "v1" / "admin.proto").write_text(changed)
    monkeypatch.setattr(generate, "ROOT", src)
    (fresh,) = [p for p in generate.generate(tmp_path / "out") if p.suffix == ".py"]
    committed = (REPO / "epp" / "_proto" / fresh.name).read_bytes()
    assert DESCRIPTOR.findall(fresh.read_bytes()) != DESCRIPTOR.findall(committed)
