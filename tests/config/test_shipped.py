"""Where the shipped rules are found: the checkout, or an install by deploy/install.sh."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from worker.config import shipped

ROOT = Path(__file__).resolve().parents[2]


def test_shipped_rules_found_in_an_installed_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run from the virtualenv install.sh made (PREFIX/venv), outside any checkout, the shipped
    rules are PREFIX/share/rules, where install.sh puts them, so `depositd init --sandbox`
    works from the installed copy."""
    prefix = tmp_path / "opt"
    shutil.copytree(ROOT / "rules", prefix / "share" / "rules")
    monkeypatch.setattr(sys, "prefix", str(prefix / "venv"))
    monkeypatch.setattr(shipped, "_CHECKOUT", tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path)
    assert shipped.shipped_rules() == prefix / "share" / "rules"


def test_missing_shipped_rules_name_where_they_were_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither a checkout nor an install: the error names the installed location too."""
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "venv"))
    monkeypatch.setattr(shipped, "_CHECKOUT", tmp_path / "elsewhere")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(shipped.ConfigError) as err:
        shipped.shipped_rules()
    assert str(tmp_path / "share" / "rules") in str(err.value)
