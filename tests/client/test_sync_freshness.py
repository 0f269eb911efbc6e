"""Freshness of the global model a device installs (issue 38, finding 1): a signed round
older than the one a device has, or a version it has seen replaced, is refused unless the
user allows a downgrade; a model whose signed expiry has passed, or whose signature covers
no signing time and expiry, is refused always. Through `meancache fl sync` against the real
model endpoint on loopback, and against an impostor that replays what it once captured
(tests.support.fl.impostor_endpoint), as anyone in the endpoint's place could."""

import base64
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from meancache.client.config import load_settings
from meancache.client.fl.sync import sync_global_model
from meancache.fl_server.model_endpoint import create_model_app
from meancache.shared.errors import FreshnessError
from meancache.shared.fl.checkpoint import LATEST, META, GlobalModel, round_dir, save_checkpoint
from meancache.shared.fl.freshness import SEEN_FILE, Version, check_fresh, newest, read_seen
from meancache.shared.fl.signing import (
    LIFETIME_SECONDS,
    PUBLIC_KEY,
    read_public_key,
    server_key,
    sign,
    verify,
)

from meancache.cli import main
from tests.support.fl import cache_threshold, impostor_endpoint, publish
from tests.support.servers import serving

Sync = Callable[..., tuple[int, str]]
SEED = int.from_bytes(os.urandom(4), "big")


@pytest.fixture
def server_root(tmp_path: Path) -> Path:
    return tmp_path / "fl-server" / "checkpoints"


@pytest.fixture
def url(server_root: Path) -> Iterator[str]:
    with serving(create_model_app(server_root)) as base:
        yield base


@pytest.fixture
def sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server_root: Path,
         capsys: pytest.CaptureFixture[str]) -> Sync:
    """`meancache fl sync --server SERVER --server-key ... ARGS` on the device under
    tmp_path/device: its exit status, stdout and stderr."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))

    def run(server: str, *args: str) -> tuple[int, str, str]:
        status = main(["--data-dir", str(tmp_path / "device"), "fl", "sync", "--server",
                       server, "--server-key", str(server_root / PUBLIC_KEY), *args])
        out = capsys.readouterr()
        return status, out.out, out.err

    return run


def device_latest(tmp_path: Path) -> str:
    return (tmp_path / "device" / "fl" / "global" / LATEST).read_text().strip()


def device_threshold(tmp_path: Path) -> float:
    return cache_threshold(load_settings(config_dir=tmp_path / "cfg",
                                         data_dir=tmp_path / "device", environ={}))


def point_latest_at(root: Path, round_number: int) -> None:
    """The server's checkpoints as after a restore from an old backup: LATEST names an
    older round than the newest one."""
    (root / LATEST).write_text(round_dir(root, round_number).name)


def one_line(err: str) -> str:
    assert err.strip().count("\n") == 0 and "Traceback" not in err, err
    return err


# the reproduction ----------------------------------------------------------------
def test_a_genuinely_signed_older_round_is_refused_from_the_real_endpoint(
        sync: Sync, url: str, server_root: Path, tmp_path: Path) -> None:
    publish(server_root, 2, 0.5)
    publish(server_root, 5, 0.9)
    status, out, _ = sync(url)
    assert status == 0 and "round 5 (threshold 0.900)" in out
    point_latest_at(server_root, 2)  # the endpoint now serves round 2, signed afresh
    status, out, err = sync(url)
    assert status != 0 and out == ""
    assert "refused the global model of round 2: this device has installed round 5" in \
        one_line(err)
    assert "--allow-downgrade" in err
    assert device_latest(tmp_path) == "round-0005"
    assert device_threshold(tmp_path) == pytest.approx(0.9)  # not 0.5


def test_a_replayed_older_round_is_refused_and_allow_downgrade_installs_it(
        sync: Sync, url: str, server_root: Path, tmp_path: Path) -> None:
    old = tmp_path / "captured"  # what an attacker saved when round 2 was the newest:
    save_checkpoint(old, 2, {"w": torch.ones(2)}, 0.5, "base", 0,  # signed by the server
                    sign=partial(sign, key=server_key(server_root)))
    publish(server_root, 5, 0.9)
    assert sync(url)[0] == 0
    with serving(impostor_endpoint(old)) as impostor:
        status, _, err = sync(impostor)
        assert status != 0 and "round 2: this device has installed round 5" in one_line(err)
        assert device_latest(tmp_path) == "round-0005"
        status, out, _ = sync(impostor, "--allow-downgrade")
    assert status == 0 and "round 2 (threshold 0.500)" in out
    assert device_latest(tmp_path) == "round-0002"
    assert device_threshold(tmp_path) == pytest.approx(0.5)


# versions seen ---------------------------------------------------------------------------
def test_a_round_seen_but_not_installed_still_bars_older_ones(
        sync: Sync, url: str, server_root: Path, tmp_path: Path) -> None:
    publish(server_root, 3, 0.8)
    assert sync(url)[0] == 0
    publish(server_root, 4, 0.7)
    weights = round_dir(server_root, 4) / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"oops")  # the download will not match
    status, _, err = sync(url)
    assert status != 0 and "does not match its sha256" in err
    assert device_latest(tmp_path) == "round-0003"
    seen = read_seen(tmp_path / "device" / "fl", "global-model")
    assert seen is not None and seen.round == 4
    point_latest_at(server_root, 3)  # now round 3 again: the device saw it replaced
    status, _, err = sync(url)
    assert status != 0
    assert "round 3: this device has already seen round 4" in one_line(err)


def test_an_earlier_signing_of_a_replaced_round_is_refused(
        sync: Sync, server_root: Path, tmp_path: Path) -> None:
    key = server_key(server_root)
    now = time.time()
    replaced = tmp_path / "replaced"  # round 7 as first published, then redone
    save_checkpoint(replaced, 7, {"w": torch.ones(2)}, 0.5, "base", 0,
                    sign=partial(sign, key=key, now=now - 600))
    save_checkpoint(server_root, 7, {"w": torch.ones(2) * 2}, 0.8, "base", 0,
                    sign=partial(sign, key=key, now=now - 60))
    with serving(impostor_endpoint(server_root)) as current:
        assert sync(current)[0] == 0
    with serving(impostor_endpoint(replaced)) as impostor:
        status, _, err = sync(impostor)
    assert status != 0
    assert "refused the global model of round 7 signed at" in one_line(err)
    assert "seen it replaced by a version signed at" in err
    assert device_threshold(tmp_path) == pytest.approx(0.8)


def test_the_record_of_versions_seen_is_one_small_json_file(
        sync: Sync, url: str, server_root: Path, tmp_path: Path) -> None:
    publish(server_root, 1, 0.8)
    assert sync(url)[0] == 0
    fl_dir = tmp_path / "device" / "fl"
    record = json.loads((fl_dir / SEEN_FILE).read_text())
    assert set(record) == {"global-model"} and record["global-model"]["round"] == 1
    assert [p.name for p in fl_dir.iterdir() if p.name.startswith(".")] == []  # no leftovers
    first = record["global-model"]["signed_at"]
    assert sync(url)[0] == 0  # the same model, signed again by the endpoint
    again = json.loads((fl_dir / SEEN_FILE).read_text())["global-model"]
    assert again["round"] == 1 and again["signed_at"] >= first


# expiry and missing freshness ------------------------------------------------------------
def test_an_expired_model_is_refused_even_with_allow_downgrade(
        sync: Sync, server_root: Path, tmp_path: Path) -> None:
    save_checkpoint(server_root, 1, {"w": torch.ones(2)}, 0.8, "base", 0,
                    sign=partial(sign, key=server_key(server_root),
                                 now=time.time() - LIFETIME_SECONDS - 60))
    with serving(impostor_endpoint(server_root)) as frozen:
        for extra in ((), ("--allow-downgrade",)):
            status, _, err = sync(frozen, *extra)
            assert status != 0
            assert "refused the global model of round 1: its signature expired at" in \
                one_line(err)
    assert not (tmp_path / "device" / "fl" / "global" / LATEST).exists()


def old_format_signature(meta: GlobalModel, root: Path) -> GlobalModel:
    """Signed as an FL server before issue 38 signed: no signing time, no expiry."""
    fields = meta.to_json()
    for name in ("signature", "signed_at", "expires"):
        fields.pop(name)
    payload = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return replace(meta, signature=base64.b64encode(server_key(root).sign(payload)).decode())


def test_a_model_signed_without_freshness_is_refused_but_the_new_endpoint_serves_it_fresh(
        sync: Sync, url: str, server_root: Path, tmp_path: Path) -> None:
    save_checkpoint(server_root, 4, {"w": torch.ones(2)}, 0.8, "base", 0,
                    sign=partial(old_format_signature, root=server_root))
    meta = json.loads((round_dir(server_root, 4) / META).read_text())
    assert meta["signed_at"] == 0 and meta["expires"] == 0
    verify(GlobalModel(**meta), read_public_key(str(server_root / PUBLIC_KEY)))  # genuine
    with serving(impostor_endpoint(server_root)) as old_server:
        status, _, err = sync(old_server, "--allow-downgrade")
    assert status != 0
    assert "its signature covers no signing time and expiry" in one_line(err)
    status, out, _ = sync(url)  # an upgraded server signs it with both
    assert status == 0 and "round 4" in out
    assert device_latest(tmp_path) == "round-0004"


# the rules on their own ------------------------------------------------------------------
@seed(SEED)
@settings(max_examples=200, deadline=None)
@given(offers=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3), st.booleans()),
                       min_size=1, max_size=12))
def test_the_rounds_a_device_accepts_never_go_down(offers: list[tuple[int, int, bool]]
                                                    ) -> None:
    """Whatever order signed versions arrive in (round, signing time, content), the
    rounds accepted without --allow-downgrade never decrease, and within a round a
    different content is accepted only when signed no earlier than the one seen."""
    print(f"hypothesis seed {SEED}")
    now = 1_000_000.0
    base = GlobalModel(0, 0.5, "0" * 64, "base", 0, {}, 0.0, "x")
    seen: Version | None = None
    installed: int | None = None
    for number, signed, other_content in offers:
        meta = replace(base, round=number, signed_at=now - 100 + signed,
                       expires=now + 100, threshold=0.6 if other_content else 0.5)
        try:
            check_fresh(meta, installed, seen, now, allow_downgrade=False)
        except FreshnessError:
            assert seen is not None and (meta.round < seen.round or (
                meta.round == seen.round and meta.signed_at < seen.signed_at
                and Version.of(meta).content != seen.content))
            continue
        assert seen is None or meta.round >= seen.round
        seen, installed = newest(seen, meta, allow_downgrade=False), meta.round


def test_the_allow_downgrade_setting_is_what_the_chat_sync_reads(
        url: str, server_root: Path, tmp_path: Path) -> None:
    publish(server_root, 2, 0.5)
    publish(server_root, 5, 0.9)
    environ = {"MEANCACHE_FL_SERVER_PUBLIC_KEY": str(server_root / PUBLIC_KEY)}
    device = load_settings(config_dir=tmp_path / "cfg", data_dir=tmp_path / "device",
                           environ=environ)
    assert device.allow_downgrade is False
    assert sync_global_model(url, device).round == 5
    point_latest_at(server_root, 2)
    with pytest.raises(FreshnessError, match="round 2: this device has installed round 5"):
        sync_global_model(url, device)
    allowing = load_settings(config_dir=tmp_path / "cfg", data_dir=tmp_path / "device",
                             environ=environ | {"MEANCACHE_ALLOW_DOWNGRADE": "true"})
    assert sync_global_model(url, allowing).round == 2
    assert device_latest(tmp_path) == "round-0002"
