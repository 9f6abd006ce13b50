"""Untrusted .pt2 loading: the archive scanner, the hardened torch.export.load, and live attack
payloads.

Every attack payload here only creates a marker file in pytest's tmp dir. ``test_payloads_are_live``
and the ``*_torch_alone_executes`` tests run them through the real unpickler / plain
``torch.export.load`` to prove they would work, so the "marker absent" assertions elsewhere are not
vacuous.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import pickle
import struct
import sys
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest
import torch

from compiler.errors import ModelError
from compiler.frontends import pt2_safety
from compiler.frontends.pt2_safety import (
    ALLOWED_GLOBALS,
    inspect_pt2_archive,
    load_exported_program,
    scan_pickle,
)
from compiler.frontends.pt2_safety import constants as pt2_constants
from compiler.frontends.pt2_safety import expressions as pt2_expressions
from compiler.frontends.pt2_safety import loading as pt2_loading
from compiler.frontends.pt2_safety import zipcheck as pt2_zipcheck
from tests.pt2_factory import Genuine, TinyNet, understated_member

LIMITS = dict(max_uncompressed_bytes=64 * 1024**2, max_members=200)


# ----------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def genuine(tmp_path_factory: pytest.TempPathFactory) -> Genuine:
    torch.manual_seed(0)
    model = TinyNet()
    with torch.no_grad():  # non-trivial batch-norm statistics
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    model.eval()
    example = torch.randn(1, 3, 8, 8)
    path = tmp_path_factory.mktemp("genuine") / "tiny.pt2"
    torch.export.save(torch.export.export(model, (example,)), path)
    return Genuine(path, model, example, "tiny")


@pytest.fixture(scope="module")
def dynamic_pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(
        torch.nn.Linear(4, 2), (torch.randn(3, 4),), dynamic_shapes={"input": {0: batch}}
    )
    path = tmp_path_factory.mktemp("dynamic") / "dyn.pt2"
    torch.export.save(ep, path)
    return path


@pytest.fixture()
def marker(tmp_path: Path) -> Path:
    return tmp_path / "pwned"


# --------------------------------------------------------------------------------- payload builders


def reduce_payload(func: Callable[..., object], *args: object, protocol: int = 2) -> bytes:
    class Evil:
        def __reduce__(self) -> tuple[object, tuple[object, ...]]:
            return func, args

    return pickle.dumps(Evil(), protocol=protocol)


def open_payload(marker: Path) -> bytes:
    """`builtins.open(marker, "w")` via GLOBAL + REDUCE (protocol 2, like torch.save writes)."""
    return reduce_payload(builtins.open, str(marker), "w")


def system_payload(marker: Path) -> bytes:
    """`os.system("touch marker")` via STACK_GLOBAL + MEMOIZE (protocol 4)."""
    return reduce_payload(os.system, f"touch {marker}", protocol=4)


def protocol0_global(marker: Path) -> bytes:
    return f"cos\nsystem\n(S'touch {marker}'\ntR.".encode()


def protocol0_inst(marker: Path) -> bytes:
    return f"(S'touch {marker}'\nios\nsystem\n.".encode()


def _sbu(text: str) -> bytes:  # SHORT_BINUNICODE
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def stack_global_via_memo(marker: Path) -> bytes:
    """Module and name pushed early, memoized, popped, and fetched back with BINGET before
    STACK_GLOBAL."""
    return (
        b"\x80\x04"
        + _sbu("builtins") + b"\x94"  # memo 0
        + _sbu("open") + b"\x94"  # memo 1
        + b"00"  # POP POP: nothing of it left on the stack
        + _sbu("torch._utils") + _sbu("_rebuild_tensor_v2") + b"00"  # decoy strings, popped
        + b"h\x00h\x01\x93"  # BINGET 0, BINGET 1, STACK_GLOBAL -> builtins.open
        + _sbu(str(marker)) + _sbu("w") + b"\x86R."
    )  # fmt: skip


def getattr_gadget(marker: Path) -> bytes:
    """getattr(__import__('os'), 'system')('touch marker')."""
    return (
        b"\x80\x02cbuiltins\ngetattr\n"
        b"cbuiltins\n__import__\n" + b"X\x02\x00\x00\x00os\x85R"
        + b"X\x06\x00\x00\x00system\x86R"
        + b"X" + struct.pack("<I", len(f"touch {marker}")) + f"touch {marker}".encode() + b"\x85R."
    )  # fmt: skip


def torch_builtins_gadget(marker: Path) -> bytes:
    """An allowlisted-looking module: torch._utils.__builtins__['open'](marker, 'w')."""
    return (
        b"\x80\x02c_operator\ngetitem\nctorch._utils\n__builtins__\nX\x04\x00\x00\x00open\x86R"
        + b"X" + struct.pack("<I", len(str(marker))) + str(marker).encode()
        + b"X\x01\x00\x00\x00w\x86R."
    )  # fmt: skip


def dotted_name_gadget(marker: Path) -> bytes:
    """Protocol-4 dotted name under an allowlisted function: _rebuild_tensor_v2.__globals__ ->
    ..."""
    return (
        b"\x80\x04" + _sbu("torch._utils") + _sbu("_rebuild_tensor_v2.__globals__") + b"\x93"
        + b"0" + open_payload(marker)[2:]
    )  # fmt: skip


PAYLOADS: dict[str, Callable[[Path], bytes]] = {
    "reduce_open_p2": open_payload,
    "reduce_system_p4": system_payload,
    "protocol0_global": protocol0_global,
    "protocol0_inst": protocol0_inst,
    "stack_global_memo": stack_global_via_memo,
    "getattr_gadget": getattr_gadget,
    "torch_builtins_gadget": torch_builtins_gadget,
    "dotted_name_gadget": dotted_name_gadget,
}


# --------------------------------------------------------------------------------- archive surgery


def rewrite(
    src: Path,
    dst: Path,
    replace: dict[str, bytes | Callable[[bytes], bytes]] | None = None,
    add: dict[str, bytes] | None = None,
) -> Path:
    """Copy a .pt2, replacing/adding members given by name relative to the archive's top folder."""
    replace, add = replace or {}, add or {}
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        root = zin.namelist()[0].split("/", 1)[0]
        for name in zin.namelist():
            data = zin.read(name)
            rel = name.split("/", 1)[1]
            if rel in replace:
                new = replace[rel]
                data = new(data) if callable(new) else new
            zout.writestr(name, data)
        for rel, data in add.items():
            zout.writestr(f"{root}/{rel}", data)
    return dst


def replace_nested_data_pkl(payload: bytes) -> Callable[[bytes], bytes]:
    def edit(nested: bytes) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(io.BytesIO(nested)) as zin, zipfile.ZipFile(out, "w") as zout:
            for name in zin.namelist():
                zout.writestr(name, payload if name.endswith("/data.pkl") else zin.read(name))
        return out.getvalue()

    return edit


def set_use_pickle(path_name: str) -> Callable[[bytes], bytes]:
    def edit(config: bytes) -> bytes:
        doc = json.loads(config)
        for meta in doc["config"].values():
            if meta["path_name"] == path_name:
                meta["use_pickle"] = True
        return json.dumps(doc).encode()

    return edit


def add_opaque_constant(config: bytes) -> bytes:
    doc = json.loads(config)
    doc["config"]["evil"] = {
        "path_name": "opaque_obj_0",
        "is_param": False,
        "use_pickle": True,
        "tensor_meta": None,
    }
    return json.dumps(doc).encode()


def sample_inputs_attack(g: Genuine, dst: Path, payload: bytes) -> Path:
    return rewrite(g.path, dst, {"data/sample_inputs/model.pt": payload})


def weights_attack(g: Genuine, dst: Path, payload: bytes) -> Path:
    return rewrite(
        g.path,
        dst,
        {
            "data/weights/weight_0": payload,
            "data/weights/model_weights_config.json": set_use_pickle("weight_0"),
        },
    )


def opaque_constant_attack(g: Genuine, dst: Path, payload: bytes) -> Path:
    return rewrite(
        g.path,
        dst,
        {"data/constants/model_constants_config.json": add_opaque_constant},
        {"data/constants/opaque_obj_0": payload},
    )


def inject_expr(marker: Path) -> Callable[[bytes], bytes]:
    code = f"__import__('builtins').open('{marker}', 'w') and "

    def edit(model_json: bytes) -> bytes:
        text = model_json.decode()
        assert '"expr_str": "Symbol(' in text
        return text.replace('"expr_str": "Symbol(', f'"expr_str": "{code}Symbol(', 1).encode()

    return edit


def zip_member_name(path: Path, suffix: str) -> str:
    with zipfile.ZipFile(path) as zf:
        return next(n for n in zf.namelist() if n.endswith(suffix))


def expect_refusal(path: Path, code: str, marker: Path | None = None, *needles: str) -> ModelError:
    with pytest.raises(ModelError) as info:
        load_exported_program(path)
    err = info.value
    assert err.code == code, err.message
    for needle in needles:
        assert needle in err.message, err.message
    assert "Traceback" not in err.message and "\n" not in err.message
    if marker is not None:
        assert not marker.exists(), "payload executed"
    return err


# ------------------------------------------------------------------------------------- genuine file


def test_genuine_archive_passes_inspection(genuine: Genuine) -> None:
    report = inspect_pt2_archive(genuine.path, **LIMITS)
    assert report.root == genuine.root
    assert report.models == ("model",)
    # The only pickle, the sample inputs, is never read (issue 32: a DynamicCache export pickles
    # objects there that are not tensors): nothing is unpickled, so nothing is scanned.
    assert report.pickles_scanned == ()
    assert report.globals_seen == frozenset()
    kinds = {m.name.split("/", 1)[1]: m.kind for m in report.members}
    assert sum(k == "raw_tensor" for k in kinds.values()) == 9  # 8 params/buffers + 1 constant
    assert kinds["data/constants/tensor_0"] == "raw_tensor"
    assert kinds["models/model.json"] == "json"
    assert kinds["data/sample_inputs/model.pt"] == "sample_inputs"
    assert report.total_uncompressed_bytes == sum(m.uncompressed_bytes for m in report.members)
    with pytest.raises(FrozenInstanceError):
        report.root = "x"  # type: ignore[misc]
    # bytes and open files are accepted too
    assert (
        inspect_pt2_archive(genuine.path.read_bytes(), **LIMITS).member_names == report.member_names
    )
    with open(genuine.path, "rb") as fh:
        assert inspect_pt2_archive(fh, **LIMITS).globals_seen == report.globals_seen


def test_genuine_archive_loads_and_matches_model(genuine: Genuine) -> None:
    ep = load_exported_program(genuine.path)
    assert isinstance(ep, torch.export.ExportedProgram)
    assert set(ep.constants) == {"offset"}
    assert "bn.running_var" in ep.state_dict
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), genuine.model(x))
    assert (
        torch.load is not None and torch.load.__module__ == "torch.serialization"
    )  # hooks removed


def test_genuine_dynamic_archive_loads(dynamic_pt2: Path) -> None:
    ep = load_exported_program(dynamic_pt2)
    assert ep.module()(torch.randn(5, 4)).shape == (5, 2)


# ----------------------------------------------------------------------------------- pickle attacks


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_payloads_are_live(name: str, marker: Path) -> None:
    """Control: each payload really runs under a plain unpickler (so the refusals below mean
    something)."""
    try:
        pickle.loads(PAYLOADS[name](marker))
    except Exception:  # noqa: BLE001 - only the marker file matters
        pass
    assert marker.exists()


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_scan_pickle_refuses_every_payload(name: str, marker: Path) -> None:
    with pytest.raises(ModelError) as info:
        scan_pickle(PAYLOADS[name](marker), member="m.pkl")
    assert info.value.code == "unsafe_pickle"
    assert "'m.pkl'" in info.value.message
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "forbidden"),
    [
        ("reduce_open_p2", "io.open"),
        ("reduce_system_p4", "posix.system"),
        ("protocol0_global", "os.system"),
        ("protocol0_inst", "os.system"),
        ("stack_global_memo", "builtins.open"),
        ("getattr_gadget", "builtins.getattr"),
        ("torch_builtins_gadget", "_operator.getitem"),
        ("dotted_name_gadget", "torch._utils._rebuild_tensor_v2.__globals__"),
    ],
)
def test_scan_pickle_names_the_forbidden_global(name: str, forbidden: str, marker: Path) -> None:
    with pytest.raises(ModelError, match=f"forbidden global {forbidden}"):
        scan_pickle(PAYLOADS[name](marker))


def test_scan_pickle_refuses_extension_registry_and_object_opcodes() -> None:
    with pytest.raises(ModelError, match="EXT1.*extension registry") as info:
        scan_pickle(b"\x80\x02\x82\x01.")
    assert info.value.code == "unsafe_pickle"
    inst_allowed_class = b"(icollections\nOrderedDict\n."
    with pytest.raises(ModelError, match="opcode INST"):
        scan_pickle(inst_allowed_class)
    with pytest.raises(ModelError, match="opcode BUILD"):
        scan_pickle(b"\x80\x02ccollections\nOrderedDict\n)R}b.")
    with pytest.raises(
        ModelError, match="not a plain string literal"
    ):  # STACK_GLOBAL on computed operands
        scan_pickle(b"\x80\x04ccollections\nOrderedDict\n)R" + _sbu("x") + b"\x93.")


def test_scan_pickle_malformed_is_bad_pt2() -> None:
    for data in (
        b"\x80\x02(X\x05\x00\x00\x00ab",
        b"\x80\x02N",
        b"\x80\x02t.",
        b"\x80\x02N.trailing",
    ):
        with pytest.raises(ModelError) as info:
            scan_pickle(data, member="x")
        assert info.value.code == "bad_pt2", data


def test_allowlist_is_within_torch_weights_only_allowlist() -> None:
    from torch._weights_only_unpickler import _get_allowed_globals

    torch_allowed = _get_allowed_globals()
    assert {f"{m}.{n}" for m, n in ALLOWED_GLOBALS} <= set(torch_allowed)


@pytest.mark.parametrize(
    "name", ["reduce_open_p2", "protocol0_global", "stack_global_memo", "getattr_gadget"]
)
def test_malicious_sample_inputs_are_never_read(
    name: str, genuine: Genuine, tmp_path: Path, marker: Path
) -> None:
    """Sample inputs are never unpickled (torch gets none): a payload there is inert, where
    plain torch.export.load runs it (its weights_only=False fallback)."""
    path = sample_inputs_attack(genuine, tmp_path / "evil.pt2", PAYLOADS[name](marker))
    if name != "getattr_gadget":  # the control: torch alone runs these payloads
        try:
            torch.export.load(path)
        except Exception:  # noqa: BLE001 - only the marker file matters
            pass
        assert marker.exists()
        marker.unlink()
    program = load_exported_program(path)
    assert program.example_inputs is None
    assert not marker.exists(), "payload executed"


def test_malicious_data_pkl_inside_nested_sample_inputs_is_never_read(
    genuine: Genuine, tmp_path: Path, marker: Path
) -> None:
    path = rewrite(
        genuine.path,
        tmp_path / "evil.pt2",
        {"data/sample_inputs/model.pt": replace_nested_data_pkl(system_payload(marker))},
    )
    load_exported_program(path)
    assert not marker.exists(), "payload executed"


def test_an_enum_reference_in_a_pytree_spec_is_refused(genuine: Genuine, tmp_path: Path) -> None:
    """torch's pytree JSON hook imports the module an ``__enum__`` object names: refused."""

    def edit(data: bytes) -> bytes:
        doc = json.loads(data)
        signature = doc["graph_module"]["module_call_graph"][0]["signature"]
        protocol, spec = json.loads(signature["in_spec"])
        spec["context"] = json.dumps({"__enum__": True, "fqn": "antigravity:Fly", "name": "X"})
        signature["in_spec"] = json.dumps([protocol, spec])
        return json.dumps(doc).encode()

    path = rewrite(genuine.path, tmp_path / "evil.pt2", {"models/model.json": edit})
    expect_refusal(path, "bad_pt2", None, "enum reference")
    assert "antigravity" not in sys.modules


def test_malicious_pickled_weight_refused(genuine: Genuine, tmp_path: Path, marker: Path) -> None:
    path = weights_attack(genuine, tmp_path / "evil.pt2", open_payload(marker))
    expect_refusal(path, "unsafe_pickle", marker, "data/weights/weight_0", "io.open")


def test_pickled_weight_location_with_protocol0_pickle_refused(
    genuine: Genuine, tmp_path: Path, marker: Path
) -> None:
    path = weights_attack(genuine, tmp_path / "evil.pt2", protocol0_inst(marker))
    expect_refusal(path, "unsafe_pickle", marker, "weight_0", "os.system")


def test_opaque_object_constant_refused(genuine: Genuine, tmp_path: Path, marker: Path) -> None:
    path = opaque_constant_attack(genuine, tmp_path / "evil.pt2", open_payload(marker))
    expect_refusal(path, "unsafe_pickle", marker, "opaque_obj_0")


@pytest.mark.parametrize("rel", ["extra/notes.txt", "data/weights/weight_99", "version2"])
def test_extra_member_with_innocent_name_refused(
    rel: str, genuine: Genuine, tmp_path: Path, marker: Path
) -> None:
    path = rewrite(genuine.path, tmp_path / "evil.pt2", add={rel: system_payload(marker)})
    expect_refusal(path, "unsafe_pickle", marker, rel, "posix.system")


def test_extra_member_pkl_name_with_protocol0_refused(
    genuine: Genuine, tmp_path: Path, marker: Path
) -> None:
    path = rewrite(
        genuine.path, tmp_path / "evil.pt2", add={"extra/readme.pkl": protocol0_global(marker)}
    )
    expect_refusal(path, "unsafe_pickle", marker, "extra/readme.pkl")


def test_unreferenced_protocol0_text_member_is_inert(
    genuine: Genuine, tmp_path: Path, marker: Path
) -> None:
    """Not scanned (it does not look like a pickle and torch never unpickles extra files): loads,
    never runs."""
    path = rewrite(
        genuine.path, tmp_path / "ok.pt2", add={"extra/notes.txt": protocol0_global(marker)}
    )
    load_exported_program(path)
    assert not marker.exists()


# ------------------------------------------------------------------- second barrier: torch itself


@pytest.fixture()
def scanner_bypassed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pt2_loading, "inspect_pt2_archive", lambda *a, **k: None)


ATTACKS: dict[str, Callable[[Genuine, Path, Path], Path]] = {
    "pickled_weight": lambda g, d, m: weights_attack(g, d, open_payload(m)),
    "opaque_constant": lambda g, d, m: opaque_constant_attack(g, d, open_payload(m)),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_torch_alone_executes_the_attack(
    attack: str, genuine: Genuine, tmp_path: Path, marker: Path
) -> None:
    """Control: plain torch.export.load (2.13) runs these payloads -- hence the scanner and the
    hooks."""
    path = ATTACKS[attack](genuine, tmp_path / "evil.pt2", marker)
    try:
        torch.export.load(path)
    except Exception:  # noqa: BLE001 - only the marker file matters
        pass
    assert marker.exists()


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_hardened_loader_refuses_with_scanner_bypassed(
    attack: str, genuine: Genuine, tmp_path: Path, marker: Path, scanner_bypassed: None
) -> None:
    path = ATTACKS[attack](genuine, tmp_path / "evil.pt2", marker)
    expect_refusal(path, "bad_pt2", marker)
    assert torch.load.__module__ == "torch.serialization"


def test_bypassed_scanner_message_mentions_weights_only(
    genuine: Genuine, tmp_path: Path, marker: Path, scanner_bypassed: None
) -> None:
    path = weights_attack(genuine, tmp_path / "evil.pt2", open_payload(marker))
    expect_refusal(path, "bad_pt2", marker, "weights-only unpickler")


# -------------------------------------------------------------------- code in the JSON (not pickle)


def test_sympy_expression_injection(dynamic_pt2: Path, tmp_path: Path, marker: Path) -> None:
    path = rewrite(dynamic_pt2, tmp_path / "evil.pt2", {"models/model.json": inject_expr(marker)})
    try:  # control: torch evaluates expr_str with sympy.sympify (eval) while loading
        torch.export.load(path)
    except Exception:  # noqa: BLE001 - only the marker file matters
        pass
    assert marker.exists()
    marker.unlink()
    expect_refusal(path, "unsafe_pt2", marker, "expr_str")


def test_sympy_injection_refused_with_scanner_bypassed(
    dynamic_pt2: Path, tmp_path: Path, marker: Path, scanner_bypassed: None
) -> None:
    path = rewrite(dynamic_pt2, tmp_path / "evil.pt2", {"models/model.json": inject_expr(marker)})
    expect_refusal(path, "unsafe_pt2", marker, "expr_str")


def test_guards_code_injection_refused(genuine: Genuine, tmp_path: Path, marker: Path) -> None:
    def edit(data: bytes) -> bytes:
        doc = json.loads(data)
        doc["guards_code"] = [f"__import__('builtins').open('{marker}', 'w') is None"]
        return json.dumps(doc).encode()

    path = rewrite(genuine.path, tmp_path / "evil.pt2", {"models/model.json": edit})
    expect_refusal(path, "unsafe_pt2", marker, "guards_code")


def test_any_member_under_models_is_checked(genuine: Genuine, tmp_path: Path, marker: Path) -> None:
    """torch deserializes every models/* member as a program, whatever its suffix."""
    with zipfile.ZipFile(genuine.path) as zf:
        doc = json.loads(zf.read(f"{genuine.root}/models/model.json"))
    doc["guards_code"] = [f"__import__('builtins').open('{marker}', 'w') is None"]
    path = rewrite(
        genuine.path, tmp_path / "evil.pt2", add={"models/notes.txt": json.dumps(doc).encode()}
    )
    expect_refusal(path, "unsafe_pt2", marker, "models/notes.txt")


@pytest.mark.parametrize(
    "guard",
    [
        "L['x'].size()[0] <= 64",
        "L['x'].size()[1] == 3",
        "2 <= L['args'][0].size()[0]",
        "math.floor(L['x'].size()[0] / 2) == 4",
    ],
)
def test_plain_guards_accepted(guard: str) -> None:
    pt2_safety.validate_guard_code(guard)


@pytest.mark.parametrize(
    "guard",
    [
        "torch.load('x') is None",
        "L['x'].__class__ == 1",
        "(lambda: 1)() == 1",
        'L["x"] == 1',
        "open('x') == 1",
    ],
)
def test_executable_guards_refused(guard: str) -> None:
    with pytest.raises(ModelError) as info:
        pt2_safety.validate_guard_code(guard)
    assert info.value.code == "unsafe_pt2"


def test_aotinductor_payload_refused(genuine: Genuine, tmp_path: Path) -> None:
    path = rewrite(
        genuine.path, tmp_path / "aoti.pt2", add={"data/aotinductor/model/model.so": b"\x7fELF"}
    )
    expect_refusal(path, "unsafe_pt2", None, "data/aotinductor/model/model.so")


# ----------------------------------------------------------------------------- structural problems


def test_truncated_archive(genuine: Genuine, tmp_path: Path) -> None:
    data = genuine.path.read_bytes()
    path = tmp_path / "cut.pt2"
    path.write_bytes(data[: len(data) // 2])
    expect_refusal(path, "pt2_truncated", None, "truncated")


def test_garbage_with_zip_magic(tmp_path: Path) -> None:
    path = tmp_path / "garbage.pt2"
    path.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 8)
    expect_refusal(path, "bad_pt2", None, "corrupt")


def test_not_a_zip(tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    path.write_bytes(b"\x80\x02}q\x00.")
    expect_refusal(path, "bad_pt2", None, "zip signature")


def test_zip_bomb_by_ratio(genuine: Genuine, tmp_path: Path) -> None:
    path = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(genuine.path) as zin, zipfile.ZipFile(path, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
        zout.writestr(
            f"{genuine.root}/extra/bomb", b"\0" * (16 * 1024**2), compress_type=zipfile.ZIP_DEFLATED
        )
    expect_refusal(path, "pt2_too_large", None, "zip bomb", "extra/bomb")


def test_member_over_size_limit(genuine: Genuine, tmp_path: Path) -> None:
    path = rewrite(genuine.path, tmp_path / "big.pt2", add={"extra/big": b"x" * 600_000})
    with pytest.raises(ModelError) as info:
        inspect_pt2_archive(path, max_uncompressed_bytes=500_000, max_members=100)
    assert info.value.code == "pt2_too_large"
    assert "extra/big" in info.value.message and "600000" in info.value.message


def test_total_size_limit(genuine: Genuine) -> None:
    with pytest.raises(ModelError, match="in total") as info:
        inspect_pt2_archive(genuine.path, max_uncompressed_bytes=10_000, max_members=100)
    assert info.value.code == "pt2_too_large"


def test_lying_declared_size_is_caught(genuine: Genuine, tmp_path: Path) -> None:
    """A member whose central-directory size understates its data cannot slip past the limits."""
    path = rewrite(genuine.path, tmp_path / "lie.pt2", add={"extra/payload": b"A" * 5000})
    data = bytearray(path.read_bytes())
    cd = data.rindex(b"PK\x01\x02")  # central directory entry of the last member
    struct.pack_into("<I", data, cd + 24, 10)  # uncompressed size := 10
    path.write_bytes(bytes(data))
    with pytest.raises(ModelError) as info:
        inspect_pt2_archive(path, **LIMITS)
    assert info.value.code in {"bad_pt2", "pt2_too_large"}


def test_too_many_members(genuine: Genuine, tmp_path: Path) -> None:
    with pytest.raises(ModelError) as info:
        inspect_pt2_archive(genuine.path, max_uncompressed_bytes=10**8, max_members=5)
    assert info.value.code == "pt2_too_many_members"


@pytest.mark.parametrize(
    "name",
    ["tiny/../evil", "../evil", "/etc/evil", "tiny/a/../../evil", "C:/evil", "tiny\\..\\evil"],
)
def test_path_traversal_member(name: str, genuine: Genuine, tmp_path: Path) -> None:
    path = tmp_path / "trav.pt2"
    with zipfile.ZipFile(genuine.path) as zin, zipfile.ZipFile(path, "w") as zout:
        for member in zin.namelist():
            zout.writestr(member, zin.read(member))
        info = zipfile.ZipInfo("placeholder")
        info.filename = name  # bypass ZipInfo's own normalisation
        zout.writestr(info, b"x")
    err = expect_refusal(path, "pt2_bad_member_name", None, "unsafe name")
    assert "evil" in err.message


def test_member_outside_archive_folder(genuine: Genuine, tmp_path: Path) -> None:
    path = tmp_path / "other.pt2"
    with zipfile.ZipFile(genuine.path) as zin, zipfile.ZipFile(path, "w") as zout:
        for member in zin.namelist():
            zout.writestr(member, zin.read(member))
        zout.writestr("other/models/model.json", b"{}")
    expect_refusal(path, "pt2_bad_member_name", None, "other/models/model.json")


def test_duplicate_member(genuine: Genuine, tmp_path: Path) -> None:
    path = tmp_path / "dup.pt2"
    with (
        zipfile.ZipFile(genuine.path) as zin,
        zipfile.ZipFile(path, "w") as zout,
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        for member in zin.namelist():
            zout.writestr(member, zin.read(member))
        zout.writestr(
            f"{genuine.root}/data/sample_inputs/model.pt", open_payload(Path("/nonexistent"))
        )
    expect_refusal(path, "pt2_bad_member_name", None, "twice")


def test_symlink_member(genuine: Genuine, tmp_path: Path) -> None:
    path = tmp_path / "link.pt2"
    with zipfile.ZipFile(genuine.path) as zin, zipfile.ZipFile(path, "w") as zout:
        for member in zin.namelist():
            zout.writestr(member, zin.read(member))
        link = zipfile.ZipInfo(f"{genuine.root}/extra/link")
        link.create_system = 3
        link.external_attr = 0o120777 << 16
        zout.writestr(link, "/etc/passwd")
    expect_refusal(path, "pt2_symlink", None, "extra/link")


def test_prepended_data(genuine: Genuine, tmp_path: Path) -> None:
    """Python's zipfile would compensate for a shifted archive, torch's reader would not: refuse."""
    data = genuine.path.read_bytes()
    # the first local member (header + data), a valid start
    first = data[: data.index(b"PK\x03\x04", 4)]
    path = tmp_path / "shifted.pt2"
    path.write_bytes(first + data)
    expect_refusal(path, "bad_pt2", None, "offsets")


def test_zip64_end_records_are_read_without_zipfile_internals(
    genuine: Genuine, tmp_path: Path
) -> None:
    """torch writes zip64 end records even for small archives; a genuine one has no shift.

    The check parses the end records itself: Python releases carrying the CVE-2025-8291 fix
    (CPython gh-139700; e.g. Ubuntu's 3.12.3 on the GPU machine) changed what
    ``zipfile._EndRecData`` returns, and reading it the old way refused every genuine .pt2 there.
    """
    data = genuine.path.read_bytes()
    assert b"PK\x06\x07" in data[-100:], "expected torch to write a zip64 locator"
    with genuine.path.open("rb") as fh:
        assert pt2_zipcheck._central_directory_shift(fh) == 0
    assert load_exported_program(genuine.path) is not None


def test_zip64_extensible_data_is_refused(genuine: Genuine, tmp_path: Path) -> None:
    """Bytes between the zip64 end record and its locator: Python versions disagree on offsets."""
    data = genuine.path.read_bytes()
    locator = data.rindex(b"PK\x06\x07")
    record = data.rindex(b"PK\x06\x06")
    pad = b"\0" * 8
    moved = bytearray(data[:record] + data[record:locator] + pad + data[locator:])
    # The record's own size field grows by the padding; the locator still points at the record.
    size_at = record + 4
    grown = int.from_bytes(data[size_at : size_at + 8], "little") + len(pad)
    moved[size_at : size_at + 8] = grown.to_bytes(8, "little")
    path = tmp_path / "extensible.pt2"
    path.write_bytes(bytes(moved))
    expect_refusal(path, "bad_pt2", None, "offsets")


def test_missing_archive_format(genuine: Genuine, tmp_path: Path) -> None:
    path = rewrite(genuine.path, tmp_path / "nofmt.pt2", {"archive_format": b"zip"})
    expect_refusal(path, "bad_pt2", None, "torch.export.save")


def test_torch_failure_is_a_clean_bad_pt2(genuine: Genuine, tmp_path: Path) -> None:
    path = rewrite(genuine.path, tmp_path / "ver.pt2", {"archive_version": b"99"})
    err = expect_refusal(path, "bad_pt2", None, "could not load the .pt2 file")
    assert "99" in err.message
    missing = expect_refusal(tmp_path / "nope.pt2", "bad_pt2")
    assert "nope.pt2" in missing.message


# ---------------------------------------------------------------- hard-coded facts about torch 2.13


def test_layout_constants_match_torch() -> None:
    from torch.export.pt2_archive import constants as c

    for name in (
        "ARCHIVE_FORMAT_PATH", "ARCHIVE_FORMAT_VALUE", "ARCHIVE_VERSION_PATH", "MODELS_DIR",
        "WEIGHTS_DIR", "CONSTANTS_DIR", "SAMPLE_INPUTS_DIR", "AOTINDUCTOR_DIR", "EXECUTORCH_DIR",
        "TENSOR_CONSTANT_FILENAME_PREFIX", "CUSTOM_OBJ_FILENAME_PREFIX",
        "OPAQUE_OBJ_FILENAME_PREFIX",
    ):  # fmt: skip
        assert getattr(pt2_constants, name) == getattr(c, name), name


def test_torch_sympy_function_list_matches_torch() -> None:
    import sympy
    import torch.utils._sympy.functions as functions

    classes = {
        n for n, v in vars(functions).items()
        if isinstance(v, type) and issubclass(v, sympy.Basic) and v.__module__ == functions.__name__
    }  # fmt: skip
    assert classes - {"MinMaxBase"} <= pt2_expressions._TORCH_SYMPY_FUNCTIONS


# ----------------------------------------------------- issue 18, case 7: sizes a header understates


@pytest.mark.parametrize("deflated", [False, True], ids=["stored", "deflated"])
def test_member_whose_header_understates_its_size_is_refused(
    genuine: Genuine, tmp_path: Path, deflated: bool
) -> None:
    path = understated_member(genuine, tmp_path / "understated.pt2", deflated=deflated)
    with zipfile.ZipFile(path) as zf:  # what the old scanner relied on: zipfile reads it as valid
        assert len(zf.read(f"{genuine.root}/extra/payload")) == (4096 if deflated else 10)
    with pytest.raises(ModelError) as info:
        inspect_pt2_archive(path, **LIMITS)
    assert info.value.code == "pt2_too_large"
    assert "extra/payload" in info.value.message
    expect_refusal(path, "pt2_too_large", None, "extra/payload")


def test_zip_bomb_message_never_shows_a_temp_file_name(genuine: Genuine, tmp_path: Path) -> None:
    from compiler.frontends.loader import load_model

    staged = tmp_path / "upload-k2j4h5"  # how the service stages an upload
    with zipfile.ZipFile(genuine.path) as zin, zipfile.ZipFile(staged, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
        zout.writestr(
            f"{genuine.root}/extra/bomb", b"\0" * (16 * 1024**2), compress_type=zipfile.ZIP_DEFLATED
        )
    for source, kwargs, shown in [
        (staged, {"display_name": "bomb.pt2"}, "bomb.pt2"),
        (staged.read_bytes(), {}, "<upload>"),
    ]:
        with pytest.raises(ModelError) as info:
            load_model(source, **kwargs)
        assert info.value.code == "pt2_too_large" and "zip bomb" in info.value.message
        assert shown in info.value.message
        assert "tunehub-upload-" not in info.value.message and staged.name not in info.value.message
