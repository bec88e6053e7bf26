import pickle

import pytest
import torch

from ponder_cli import PonderError
from ponder_cli.checkpoint import load_checkpoint, load_model, save_checkpoint
from ponder_cli.config import PonderConfig
from ponder_cli.model import PonderNet


def _payload(cfg=PonderConfig(max_steps=3)):
    return {"config": cfg.to_dict(), "model": PonderNet(cfg).state_dict(), "epoch": 1}


def test_round_trip_rebuilds_the_model_from_its_config(tmp_path):
    cfg = PonderConfig(max_steps=3, hidden=8)
    torch.manual_seed(0)
    save_checkpoint(_payload(cfg), tmp_path / "best.pt")
    model, loaded_cfg, ckpt = load_model(tmp_path / "best.pt", "cpu")
    assert loaded_cfg == cfg and ckpt["epoch"] == 1 and ckpt["version"] == 1
    assert model.max_steps == 3
    assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]  # no temp file left behind


class _Payload:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (str(self.target), "w"))


def test_pickled_code_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"format": "ponder_cli", "version": 1, "evil": _Payload(marker)}, path)
    with pytest.raises(PonderError, match="refused"):
        load_checkpoint(path)
    assert not marker.exists()


@pytest.mark.parametrize("content", [b"", b"not a checkpoint", b"PK\x03\x04truncated"])
def test_garbage_files_give_one_line_errors(tmp_path, content):
    path = tmp_path / "bad.pt"
    path.write_bytes(content)
    with pytest.raises(PonderError) as err:
        load_checkpoint(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_not_ours_and_missing(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(PonderError, match="not a ponder_cli checkpoint"):
        load_checkpoint(tmp_path / "other.pt")
    with pytest.raises(PonderError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(PonderError, match="directory"):
        load_checkpoint(tmp_path)
