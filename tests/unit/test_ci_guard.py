"""The guard that makes CI fail, rather than skip, when an extra or a CPU feature it covers is missing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ci_guard import REQUIRE_ENV, missing_requirements, required_by_environment

REPO = Path(__file__).resolve().parents[2]


def test_installed_modules_and_present_flags_are_not_missing() -> None:
    assert missing_requirements(["numpy", "cpu:sse2"], flags=frozenset({"sse2", "avx2"})) == []


def test_a_missing_module_and_a_missing_flag_are_named() -> None:
    missing = missing_requirements(["numpy", "kiln_no_such_extra", "cpu:amx_tile"], flags=frozenset({"avx2"}))
    assert missing == [
        "module 'kiln_no_such_extra' (not installed: its extra is missing from this environment)",
        "CPU flag 'amx_tile' (not in /proc/cpuinfo)",
    ]


def test_the_list_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_ENV, " torch, cpu:avx2 ,,")
    assert required_by_environment() == ["torch", "cpu:avx2"]
    monkeypatch.delenv(REQUIRE_ENV)
    assert required_by_environment() == []


@pytest.mark.slow
def test_pytest_refuses_to_run_without_a_required_module() -> None:
    test = f"{Path(__file__).relative_to(REPO)}::test_installed_modules_and_present_flags_are_not_missing"
    env = {"PATH": "/usr/bin:/bin", REQUIRE_ENV: "numpy,kiln_no_such_extra"}
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == pytest.ExitCode.USAGE_ERROR, ran.stdout + ran.stderr
    assert "kiln_no_such_extra" in ran.stderr and "not installed" in ran.stderr
