"""Option and environment validation: every bad value is an error that lists what is allowed."""

from __future__ import annotations

import pytest
import torch

import torchburn
from torchburn.options import CompileOptions, parse_options


def test_defaults() -> None:
    assert parse_options(None) == CompileOptions(engine=None, fallback="warn", cache="on", verbose=False)


def test_valid_options_are_kept() -> None:
    opts = parse_options({"engine": "reference", "fallback": "ERROR", "cache": "memory", "verbose": True})
    assert opts == CompileOptions("reference", "error", "memory", True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"engin": "reference"}, "unknown torchburn option(s) 'engin'; allowed: 'engine', 'fallback'"),
        ({"fallback": "maybe"}, "options[\"fallback\"] must be one of 'warn', 'error', 'silent'; got 'maybe'"),
        ({"cache": 1}, "options[\"cache\"] must be one of 'on', 'memory', 'off'; got 1"),
        ({"verbose": "yes"}, 'options["verbose"] must be True or False'),
        ({"engine": 3}, 'options["engine"] must be an engine name'),
    ],
)
def test_bad_options_are_rejected(options: dict[str, object], message: str) -> None:
    with pytest.raises(torchburn.OptionsError) as info:
        parse_options(options)
    assert message in str(info.value)


def test_bad_option_reaches_the_user_through_torch_compile() -> None:
    f = torch.compile(lambda x: x + 1, backend="torchburn", options={"fallback": "sometimes"})
    with pytest.raises(Exception, match="must be one of 'warn', 'error', 'silent'"):
        f(torch.ones(3))


def test_unknown_engine_lists_installed_ones() -> None:
    f = torch.compile(lambda x: x + 1, backend="torchburn", options={"engine": "nope"})
    with pytest.raises(Exception, match=r"unknown engine 'nope'; installed engines: .*'reference'"):
        f(torch.ones(3))


def test_missing_first_party_engine_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchburn.engines import discovery

    installed = discovery._registry()
    # as if torchburn-wgpu were not installed
    without_wgpu = {name: entry for name, entry in installed.items() if entry[0].name != "wgpu"}
    monkeypatch.setattr(discovery, "_registry", lambda: without_wgpu)
    with pytest.raises(torchburn.EngineNotFoundError, match=r"pip install 'torchburn\[wgpu\]'"):
        torchburn.get_engine("wgpu")
    with pytest.raises(torchburn.EngineNotFoundError, match=r"pip install 'torchburn\[wgpu\]'"):
        torchburn.get_engine("burn-wgpu")


def test_bad_environment_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_DEVICE", "tpu")
    with pytest.raises(torchburn.OptionsError, match="TORCHBURN_DEVICE must be one of 'cpu', 'gpu', 'auto'; got 'tpu'"):
        torchburn.active_engine()
    monkeypatch.delenv("TORCHBURN_DEVICE")
    monkeypatch.setenv("TORCHBURN_ENGINE", "turbo")
    with pytest.raises(
        torchburn.OptionsError, match=r"TORCHBURN_ENGINE='turbo' is not an installed engine; allowed: .*'reference'"
    ):
        torchburn.active_engine()
