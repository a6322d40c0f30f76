"""The .pt2 checks on their own: every way in is refused by name, and no code from the file ever runs."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from tests.hostile_models import code_pickle, pickle_pt2, zip_bomb_pt2
from tuner.errors import InvalidModel, ModelTooLarge
from tuner.frontend import load_model, read_signature
from tuner.frontend.pt2_archive import WEIGHTS_ONLY_ENV, check_archive

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("route", ["sample_inputs", "use_pickle"])
def test_code_in_a_program_never_runs(tmp_path: Path, route: str) -> None:
    marker = tmp_path / "pwned"
    evil = pickle_pt2(tmp_path / "evil.pt2", route, marker)
    for load in (load_model, read_signature):
        with pytest.raises(InvalidModel, match="refuses for safety"):
            load(evil)
    assert not marker.exists()
    assert os.environ[WEIGHTS_ONLY_ENV] == "1"


def test_torch_load_stays_restricted_even_when_asked_not_to_be(tmp_path: Path) -> None:
    # What torch.export.load's fallback does: it must not run the pickle once Kiln has loaded a program.
    import io

    from tuner.frontend.torch import import_torch

    marker = tmp_path / "pwned"
    import_torch()
    with pytest.raises(Exception, match="(?i)weights only|weights_only"):
        torch.load(io.BytesIO(code_pickle(marker)), weights_only=False)
    assert not marker.exists()


def test_a_decompression_bomb_is_refused_from_the_directory(tmp_path: Path) -> None:
    bomb = zip_bomb_pt2(tmp_path / "bomb.pt2", unpacked_mb=64)
    with pytest.raises(ModelTooLarge, match="inflates .*-fold"):
        check_archive(bomb, max_unpacked_bytes=1 << 30)
    with pytest.raises(ModelTooLarge, match="unpacks to more than 32 MiB"):
        load_model(bomb, max_unpacked_bytes=32 << 20)


@pytest.mark.parametrize("name", ["model/../../escape", "/abs/model.json", "model\\win.json"])
def test_members_with_paths_outside_the_archive_are_refused(tmp_path: Path, name: str) -> None:
    path = tmp_path / "odd.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/archive_format", "pt2")
        archive.writestr(name, "{}")
    with pytest.raises(InvalidModel, match="outside the archive"):
        load_model(path)


def test_symbolic_link_members_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "link.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/archive_format", "pt2")
        link = zipfile.ZipInfo("model/data/weights/weight_0")
        link.external_attr = 0o120777 << 16
        archive.writestr(link, "/etc/passwd")
    with pytest.raises(InvalidModel, match="symbolic link"):
        load_model(path)


def test_opaque_constants_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "opaque.pt2"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/archive_format", "pt2")
        archive.writestr(
            "model/data/constants/model_constants_config.json",
            '{"config": {"obj": {"path_name": "opaque_obj_0", "use_pickle": false}}}',
        )
    with pytest.raises(InvalidModel, match="'data/constants/opaque_obj_0'"):
        load_model(path)
