"""The overlapped F&B pair's dropout check under recomputation (autoplan/execute/overlap_f_b.py): a stage whose
dropout draws is found by name before the pair runs; one whose dropout cannot draw is not."""

import torch.nn as nn

from autoplan.execute.overlap_f_b import _active_dropout


def _stage(p: float) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Dropout(p)))


def test_a_stage_whose_dropout_draws_is_named():
    assert _active_dropout(_stage(0.1)) == "1.1"
    assert _active_dropout(nn.Dropout2d(0.5)) == "Dropout2d"  # the stage module itself


def test_a_stage_whose_dropout_cannot_draw_passes():
    assert _active_dropout(_stage(0.0)) == ""  # p = 0 draws nothing
    assert _active_dropout(_stage(0.1).eval()) == ""  # not in training
    assert _active_dropout(nn.Linear(4, 4)) == ""
